#!/usr/bin/env bash
# The GPU checks of one device call, most wanted first, each stopped by what is left of BUDGET
# seconds (a check with under a minute left is skipped): GRPO steps through benchmarks/grpo_step.py,
# one row per step appended to $OUT/grpo_step.csv.
#   1. the ALFWorld CPU recipe with its trained model (ALFWORLD_MODEL, a seed's SFT model), as is;
#   2. the same recipe on a random-init SHAPE model (bf16) with that model's tokenizer and prompt;
#   3. household at the papers' rollout size (16 x 8) on SHAPE, bf16, prefix packing on, then off;
#   4. the same through FSDP2 on one rank with activation checkpointing.
# Run from the repository root with agentrl and the ALFWorld engine importable:
#   ALFWORLD_ARCHIVE=.../alfworld_json_2.1.1_slim.tar.xz ALFWORLD_MODEL=runs/alfworld-cpu/seed0/sft/model \
#   OUT=results bash benchmarks/gpu_check.sh
set -u
OUT=${OUT:?a folder for the rows}; BUDGET=${BUDGET:-540}; SHAPE=${SHAPE:-qwen2.5-1.5b}
CSV=$OUT/grpo_step.csv
STEP=(python3 benchmarks/grpo_step.py --out "$CSV")
ALFWORLD=(--recipe recipes/alfworld-cpu.yaml --set "env.data=$ALFWORLD_ARCHIVE" --steps 3)
LARGE=(--shape "$SHAPE" --dtype bfloat16)

source "$(dirname "$0")/gpu_budget.sh"  # check NAME COMMAND...

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
check alfworld-trained "${STEP[@]}" "${ALFWORLD[@]}" --model "$ALFWORLD_MODEL"
check alfworld-large "${STEP[@]}" "${ALFWORLD[@]}" "${LARGE[@]}" --tokenizer "$ALFWORLD_MODEL"
check household-packed "${STEP[@]}" "${LARGE[@]}"
check household-unpacked "${STEP[@]}" "${LARGE[@]}" --set rl.pack_prefixes=false
check household-fsdp2 torchrun --nproc_per_node 1 "${STEP[@]:1}" "${LARGE[@]}" --backend fsdp2 \
    --activation-checkpointing
