#!/usr/bin/env bash
# Issue 43's GPU check, one device call: generation and training overlapped (`rl.overlap`) on CUDA,
# the sampler process and the trainer sharing the machine's one GPU (`rl.overlap.sampler_gpu: 0`).
# Each check is stopped by what is left of BUDGET seconds (one with under a minute left is skipped):
#   1. benchmarks/overlap.py on real ALFWorld with full history, a random-init model of SHAPE in bf16
#      (the papers' size; every episode plays to the 30-step limit), lock-step against k = 1;
#   2. tests/test_overlap.py with CUDA visible (the trainer, the sampler process and their weight
#      pushes, fingerprints and staleness checks on the GPU);
#   3. the same as 1 on the demo recipe (tiny model, household), as the CPU rows were measured.
# 2026-12-04 (one H200) the tests ran first (106 s with the install) and 1 did not finish its 3 + 3
# steps in the 365 s left; in the next session, first and alone (BUDGET=560), it did not finish
# lock-step's 3 steps in 492 s, and nothing came back: overlap.py now prints each step as it ends
# (and the time to the first), and STEPS is 2 (the first left out as warm-up). The random-init model's
# moves are nearly all refused by the engine, so the recipe's `sampling.retries: 4` made it sample
# every turn 5 times (30 turns x 5 x 32 tokens a step); a trained agent seldom retries, so the check
# sets retries to 0 in both loops, and 8 environment workers (of the 16 cores) so that the engines
# do not stand in for generation.
# Rows are appended to $OUT/overlap.csv. Carried in .gpu (ignored through .git/info/exclude):
# whl/ (cp312 wheels of pydantic and ALFWorld's dependencies, which the machine lacks), libs.tar.xz
# (jericho and fast_downward from .venv), alfworld_json_2.1.1_slim.tar.xz, and alf-full-model (a
# full-history ALFWorld model folder: its tokenizer and prompt for the random-init SHAPE model),
# all made by benchmarks/gpu_overlap_prepare.sh.
#   OUT=results BUDGET=540 bash benchmarks/gpu_overlap.sh
# The tracked tree (140 MB, 137 of it benchmarks/results/*-seeds and alfworld-full) is over the 64 MiB
# a call carries: for the call, `git rm -r -q --cached` those three folders and list them in
# .git/info/exclude, then `git reset -q` and drop the three lines (the files never leave the disk; commit nothing in between).
set -u
OUT=${OUT:?a folder for the rows}; BUDGET=${BUDGET:-540}; SHAPE=${SHAPE:-qwen2.5-1.5b}; STEPS=${STEPS:-2}
SITE=/tmp/agentrl-site
export PYTHONPATH=$PWD/src:$PWD/benchmarks:$SITE PYTHONUNBUFFERED=1
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
CSV=$OUT/overlap.csv
OVERLAP=(python3 benchmarks/overlap.py --out "$CSV" --threads 8 --overlap-set rl.overlap.sampler_gpu=0)

source "$(dirname "$0")/gpu_budget.sh"  # check NAME COMMAND...

if [ -d .gpu/whl ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .gpu/whl/*.whl || exit 1
    tar -C "$SITE" -xJf .gpu/libs.tar.xz || exit 1
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
python3 -c "import torch, transformers; print(torch.__version__, transformers.__version__, torch.cuda.is_available())"

python3 - "$SHAPE" <<'EOF'
import json, sys
from pathlib import Path
from grpo_step import make_model
folder = Path("/tmp/alf-shape")
make_model(folder, sys.argv[1], "bfloat16", ".gpu/alf-full-model")
config = json.loads((folder / "config.json").read_text())
config["max_position_embeddings"] = 16384  # full-history episodes run past make_model's 4,096
(folder / "config.json").write_text(json.dumps(config, indent=2))
EOF
check alfworld "${OVERLAP[@]}" --recipe recipes/alfworld-cpu.yaml --model /tmp/alf-shape --steps "$STEPS" \
    --set env.data=.gpu/alfworld_json_2.1.1_slim.tar.xz --set prompt.full_history=true --set model.dtype=bfloat16 \
    --set sampling.retries=0 --set rl.env_pool.workers=8
check tests timeout 150 python3 -m pytest -q -n 4 -p no:cacheprovider tests/test_overlap.py
python3 -m agentrl.cli model init recipes/demo.yaml --out /tmp/demo-model > /dev/null
check demo "${OVERLAP[@]}" --recipe recipes/demo.yaml --model /tmp/demo-model --steps 6
