"""RL steps per hour with generation and training overlapped (`rl.overlap`) against the lock-step
loop, side by side in one run, on the same cores.

For each recipe: the same model and settings, `--steps` RL steps of each loop, each loop in a
fresh process, one after the other (nothing else should run): lock-step in one process with
`--threads` torch threads; overlapped with k = 1, the sampler process and the trainer with
`--threads` / 2 threads each (on 2 cores: one each; `--sampler-threads N` / `--trainer-threads N`
set either side; `--overlap-set` overrides the overlapped loop only, e.g. `rl.rollout.mode=async`
so that its environments step while it generates).
Every step is timed and printed as it ends (after the time to the first step); the first
`--warmup` steps (worker and sampler-process start, the engines' JIT) are left out of the medians.
Printed and appended to benchmarks/results/overlap.csv: the median step, steps per hour, and the ratio
(overlapped / lock-step steps per hour: > 1 means overlap is faster), with where each step's time
went (lock-step: generation, environments, update; overlapped: the trainer's wait for rollouts
and the sampler's idle time).

    python benchmarks/overlap.py --recipe recipes/scienceworld-cpu.yaml --model runs/scienceworld-cpu/seed0/rl/model
    python benchmarks/overlap.py --recipe recipes/demo.yaml --model DIR    # e.g. from `agentrl model init`
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from results_csv import append_rows, commit

PARTS = ["gen", "env", "update", "wait_rollouts", "sampler_idle"]


def child(args) -> None:
    """One loop's steps, timed; a JSON line on stdout."""
    import torch

    from agentrl.recipe import load_config
    from agentrl.trainer import RLTrainer

    torch.set_num_threads(args.child_threads)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as run_dir:
        # the loop's rl.overlap first, so that an --overlap-set such as rl.overlap.sampler_gpu=0 refines it
        config = load_config(args.recipe, [f"rl.overlap={args.child_overlap}", *args.set, f"run_dir={run_dir}",
                                           f"rl.steps={args.steps}", "rl.eval_every=0"])
        with RLTrainer(config, args.model, Path(run_dir)) as trainer:
            print(json.dumps({"ready_s": round(time.perf_counter() - started, 1)}), flush=True)
            for _ in range(args.steps):
                started = time.perf_counter()
                metrics = trainer.train_step()
                print(json.dumps({"step_s": time.perf_counter() - started,
                                  **{part: metrics.get(f"timing_s/{part}", 0.0) for part in PARTS}}), flush=True)


def measure(args, overlap: str, threads: int, extra: list[str]) -> list[dict]:
    command = [sys.executable, __file__, "--recipe", args.recipe, "--model", args.model, "--steps", str(args.steps),
               "--child-overlap", overlap, "--child-threads", str(threads),
               *[f"--set={s}" for s in [*args.set, *extra]]]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    with tempfile.TemporaryFile("w+") as stderr:
        child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=stderr, text=True, env=env)
        rows = []
        for line in child.stdout:  # each step printed as it ends: seen even if the run is stopped
            print(f"  {'lock-step' if overlap == 'null' else 'overlapped'}: {line.strip()}", flush=True)
            if line.startswith('{"step_s"'):
                rows.append(json.loads(line))
        if child.wait():
            stderr.seek(0)
            sys.exit(f"{overlap}: exit {child.returncode}\n{stderr.read()[-3000:]}")
    return rows


def summary(rows: list[dict], warmup: int) -> dict:
    kept = rows[warmup:]
    step = statistics.median(r["step_s"] for r in kept)
    return {"step_s": round(step, 2), "steps_per_hour": round(3600 / step, 1),
            **{f"{part}_s": round(statistics.median(r[part] for r in kept), 2) for part in PARTS}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--recipe", required=True)
    parser.add_argument("--model", required=True, help="the model RL starts from")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2, help="cores given to each loop")
    parser.add_argument("--sampler-threads", type=int, help="the sampler process's threads (default: half)")
    parser.add_argument("--trainer-threads", type=int, help="the overlapped trainer's threads (default: half)")
    parser.add_argument("--set", action="append", default=[], help="a recipe override for both loops")
    parser.add_argument("--overlap-set", action="append", default=[],
                        help="a recipe override for the overlapped loop only (e.g. rl.rollout.mode=async)")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "overlap.csv"))
    parser.add_argument("--child-overlap", help=argparse.SUPPRESS)
    parser.add_argument("--child-threads", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child_overlap is not None:
        return child(args)
    half = max(1, args.threads // 2)
    sampler = args.sampler_threads or half
    trainer = args.trainer_threads or half
    overlapped = f"{{staleness: 1, sampler_threads: {sampler}, trainer_threads: {trainer}}}"
    lock = summary(measure(args, "null", args.threads, []), args.warmup)
    print("lock-step:", json.dumps(lock), flush=True)  # seen even if the overlapped loop does not finish
    ahead = summary(measure(args, overlapped, trainer, args.overlap_set), args.warmup)
    row = {"recipe": Path(args.recipe).stem, "cpus": os.cpu_count(), "commit": commit(), "steps": args.steps,
           "warmup": args.warmup, "threads": args.threads, "sampler_threads": sampler,
           "trainer_threads": trainer, "overrides": " ".join(args.set),
           "overlap_overrides": " ".join(args.overlap_set),
           **{f"lockstep_{k}": v for k, v in lock.items()}, **{f"overlap_{k}": v for k, v in ahead.items()},
           "speedup": round(ahead["steps_per_hour"] / lock["steps_per_hour"], 2)}
    print(json.dumps(row, indent=1))
    append_rows(args.out, [row])


if __name__ == "__main__":
    main()
