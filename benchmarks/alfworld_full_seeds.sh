#!/usr/bin/env bash
# Issue 40's seeds of full history on real ALFWorld, one at a time, resumable: each seed is
# `make alfworld-cpu-full SEED=k ARM=$ARM` (ARM=full, the default, or restated; it continues a
# stopped run from its last checkpoint; SFT is checkpointed every 100 steps, a setting that does not
# change what it computes), and each finished seed is archived, slimmed, in
# benchmarks/results/alfworld-full/$ARM/seed<k>.
#     ARM=restated nohup setsid bash benchmarks/alfworld_full_seeds.sh 0 1 2 3 4 > /dev/null 2>&1 &
# A seed takes longer than a session, and a session may find a new machine: at a session's end,
# stop the chain (at a checkpoint: SFT saves every 100 steps, RL every 2) and carry its state in
# the repository with `--pack` (benchmarks/run_kit.py; the archived seeds and the DAgger aggregates,
# rewritten from their sources, are left out); on a machine without runs/alfworld-cpu-$ARM the chain
# unpacks the kit first and goes on from where it stopped.
#     pkill -TERM -f alfworld_full_seeds.sh; pkill -TERM -f "agentrl run recipes/alfworld-cpu.yaml"
#     ARM=restated bash benchmarks/alfworld_full_seeds.sh --pack && git add benchmarks/results/alfworld-full/*resume-kit.tar.xz
set -euo pipefail
cd "$(dirname "$0")/.."
ARM=${ARM:-full}
RUNS=runs/alfworld-cpu-$ARM
RESULTS=benchmarks/results/alfworld-full
KIT=${KIT:-$RESULTS/$ARM-resume-kit.tar.xz}
if [ "${1:-}" = --pack ]; then
    exclude=(--exclude '*/aggregate*.jsonl')
    for archived in "$RESULTS/$ARM"/seed*; do
        [ -d "$archived" ] && exclude+=(--exclude "$(basename "$archived")/*")
    done
    exec .venv/bin/python benchmarks/run_kit.py pack "$RUNS" "$KIT" "${exclude[@]}"
fi
if [ ! -d "$RUNS" ] && [ -f "$KIT" ]; then
    .venv/bin/python benchmarks/run_kit.py unpack "$KIT"
fi
LOG=${LOG:-$RUNS/chain.log}
mkdir -p "$(dirname "$LOG")"
export OMP_NUM_THREADS=2
for seed in "$@"; do
    dest=$RESULTS/$ARM/seed$seed
    if [ -d "$dest" ]; then
        echo "$(date -u +%FT%TZ) seed $seed: archived already" >> "$LOG"
        continue
    fi
    echo "$(date -u +%FT%TZ) seed $seed: start" >> "$LOG"
    make alfworld-cpu-full SEED="$seed" ARM="$ARM" SET="sft.save_every=100" >> "$LOG" 2>&1
    .venv/bin/python benchmarks/archive_run.py "$RUNS/seed$seed" "$dest" >> "$LOG"
    echo "$(date -u +%FT%TZ) seed $seed: done, archived in $dest" >> "$LOG"
done
