#!/usr/bin/env bash
# Issue 40's seeds of full history on real ALFWorld, one at a time, resumable: each seed is
# `make alfworld-cpu-full SEED=k` (which continues a stopped run from its last checkpoint; SFT is
# checkpointed every 100 steps, a setting that does not change what it computes), and each
# finished seed is archived, slimmed, in benchmarks/results/alfworld-full/full/seed<k>.
#     nohup setsid bash benchmarks/alfworld_full_seeds.sh 1 2 3 4 > /dev/null 2>&1 &
set -euo pipefail
cd "$(dirname "$0")/.."
LOG=${LOG:-runs/alfworld-cpu-full/chain.log}
mkdir -p "$(dirname "$LOG")"
export OMP_NUM_THREADS=2
for seed in "$@"; do
    dest=benchmarks/results/alfworld-full/full/seed$seed
    if [ -d "$dest" ]; then
        echo "$(date -u +%FT%TZ) seed $seed: archived already" >> "$LOG"
        continue
    fi
    echo "$(date -u +%FT%TZ) seed $seed: start" >> "$LOG"
    make alfworld-cpu-full SEED="$seed" SET="sft.save_every=100" >> "$LOG" 2>&1
    .venv/bin/python benchmarks/archive_run.py "runs/alfworld-cpu-full/seed$seed" "$dest" >> "$LOG"
    echo "$(date -u +%FT%TZ) seed $seed: done, archived in $dest" >> "$LOG"
done
