"""Environment steps per second through the pool, for 1..N worker processes, on each engine.

Every worker holds one environment (slots = workers) and plays random admissible actions; the
baseline is one worker, and parallel efficiency = rate(N) / (N x rate(1)). Resets are timed
apart (ALFWorld's ~1 s reset would otherwise hide the step rate). The in-process pool
(workers=0, what a single-process script does) is the first row.

    python benchmarks/env_throughput.py                       # all engines, workers 1 2 4
    python benchmarks/env_throughput.py --engines household --workers 1 2 4 8

Rows are appended to benchmarks/results/env_throughput.csv.
"""

from __future__ import annotations

import argparse
import os
import random
import time
from pathlib import Path

from agentrl.config import AlfWorldEnvConfig, HouseholdEnvConfig, ScienceWorldEnvConfig
from agentrl.envs.base import sample_tasks
from agentrl.envs.pool import EnvPool
from results_csv import append_rows, commit

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"
CONFIGS = {
    "household": lambda: HouseholdEnvConfig(max_steps=10**6),
    "alfworld": lambda: AlfWorldEnvConfig(data=str(SHARED / "alfworld" / "alfworld_json_2.1.1_slim.tar.xz"),
                                          max_steps=10**6),
    "scienceworld": lambda: ScienceWorldEnvConfig(splits_dir=str(SHARED / "scienceworld"), max_steps=10**6),
}


def measure(config, workers: int, rounds: int, warmup: int = 5, seed: int = 0) -> dict:
    slots = max(workers, 1)
    rng = random.Random(seed)
    with EnvPool(config, workers) as pool:
        tasks = sample_tasks(pool.local, "train", slots, rng)
        start = time.perf_counter()
        observations = pool.reset(dict(enumerate(tasks)))
        reset_s = time.perf_counter() - start
        steps = 0
        for round_ in range(warmup + rounds):  # warm-up rounds first (the JVM's JIT), untimed
            if round_ == warmup:
                steps, start = 0, time.perf_counter()
            actions = {s: rng.choice(o.admissible_actions) for s, o in observations.items()}
            results = pool.step(actions)
            steps += len(results)
            observations = {s: r.observation for s, r in results.items()}
        step_s = time.perf_counter() - start
    return {"slots": slots, "steps": steps, "step_s": step_s, "reset_s_per_env": reset_s / slots,
            "steps_per_s": steps / step_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--engines", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    parser.add_argument("--workers", nargs="+", type=int, default=[1, 2, 4])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "env_throughput.csv"))
    args = parser.parse_args()
    rows = []
    for engine in args.engines:
        base = None
        for workers in [0, *args.workers]:
            r = measure(CONFIGS[engine](), workers, args.rounds)
            if workers == 1:
                base = r["steps_per_s"]
            efficiency = r["steps_per_s"] / (workers * base) if workers >= 1 and base else None
            rows.append({"engine": engine, "cpus": os.cpu_count(), "commit": commit(), "workers": workers,
                         "slots": r["slots"], "steps": r["steps"], "steps_per_s": round(r["steps_per_s"], 1),
                         "reset_s_per_env": round(r["reset_s_per_env"], 3),
                         "efficiency": None if efficiency is None else round(efficiency, 2)})
            print(rows[-1], flush=True)
    append_rows(args.out, rows)


if __name__ == "__main__":
    main()
