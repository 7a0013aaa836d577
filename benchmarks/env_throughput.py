"""Environment steps per second through the pool, for 1..N workers, on each engine and backend.

Every worker holds one environment (slots = workers), all on the same task (ScienceWorld's
step cost varies several-fold between tasks), and plays random admissible actions, each
moving on as soon as its own step answers; the baseline is one worker of the same backend, and parallel efficiency = rate(N) / (N x rate(1)).
Resets are timed apart (ALFWorld's ~1 s reset would otherwise hide the step rate). The
in-process pool (workers=0, what a single-process script does) is the first row. Backends:
process (local worker processes) and ray (Ray actors on a local cluster of this machine's CPUs,
each reserving `--ray-cpus`).

    python benchmarks/env_throughput.py                       # all engines, workers 1 2 4, process
    python benchmarks/env_throughput.py --engines household --workers 1 2 4 8 --backends process ray

Rows are appended to benchmarks/results/env_throughput.csv.
"""

from __future__ import annotations

import argparse
import os
import random
import time
from pathlib import Path

from results_csv import append_rows, commit

from agentrl.config import EnvPoolConfig
from agentrl.envs.alfworld.env import AlfWorldEnvConfig
from agentrl.envs.base import sample_tasks
from agentrl.envs.household.env import HouseholdEnvConfig
from agentrl.envs.pool import EnvPool
from agentrl.envs.scienceworld.env import ScienceWorldEnvConfig

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"
CONFIGS = {
    "household": lambda: HouseholdEnvConfig(max_steps=10**6),
    "alfworld": lambda: AlfWorldEnvConfig(data=str(SHARED / "alfworld" / "alfworld_json_2.1.1_slim.tar.xz"),
                                          max_steps=10**6),
    "scienceworld": lambda: ScienceWorldEnvConfig(splits_dir=str(SHARED / "scienceworld"), max_steps=10**6),
    "scienceworld+valid": lambda: ScienceWorldEnvConfig(splits_dir=str(SHARED / "scienceworld"), max_steps=10**6,
                                                        valid_actions=True),
}
LOOKS = ("look at", "go to", "open", "pick up", "focus on")


def random_action(observation, rng: random.Random) -> str:
    """A random admissible action; where the environment lists none (ScienceWorld without
    valid_actions), a random verb on a random object in view."""
    if observation.admissible_actions:
        return rng.choice(observation.admissible_actions)
    objects = observation.info.get("objects") or ["room"]
    return f"{rng.choice(LOOKS)} {rng.choice(objects)}"


def measure(config, pool_config: EnvPoolConfig, rounds: int, warmup: int, seed: int = 0) -> dict:
    slots = max(pool_config.workers, 1)
    rng = random.Random(seed)
    with EnvPool(config, pool_config) as pool:
        tasks = sample_tasks(pool.local, "train", 1, random.Random(seed)) * slots  # one task: the same cost per step
        start = time.perf_counter()
        observations = pool.reset(dict(enumerate(tasks)))
        reset_s = time.perf_counter() - start
        # Each environment steps on as soon as it answers (the pool's submit / receive): in
        # lock-step, every round would wait for the slowest of the round's steps.
        done = {s: 0 for s in observations}
        pool.submit("step", {s: random_action(o, rng) for s, o in observations.items()})
        start = stop = None  # timed: from when every environment is warm to when the first one is through
        while pool.pending:
            for slot, result in pool.receive().items():
                done[slot] += 1
                if start is None and min(done.values()) >= warmup:  # warm-up first (the JIT compiler), untimed
                    start, timed_from = time.perf_counter(), sum(done.values())
                if stop is None and done[slot] >= warmup + rounds:
                    stop, steps = time.perf_counter(), sum(done.values()) - timed_from
                if stop is None:
                    pool.submit("step", {slot: random_action(result.observation, rng)})
        step_s = stop - start
    return {"slots": slots, "steps": steps, "step_s": step_s, "reset_s_per_env": reset_s / slots,
            "steps_per_s": steps / step_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--engines", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    parser.add_argument("--workers", nargs="+", type=int, default=[1, 2, 4])
    parser.add_argument("--backends", nargs="+", default=["process"], choices=["process", "ray"])
    parser.add_argument("--ray-cpus", type=float, default=0.5, help="CPUs each Ray actor reserves")
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--warmup", type=int, default=100,
                        help="untimed rounds first: a JVM compiles ScienceWorld's hot code for its first few hundred "
                             "steps, on more than one core (a training run's environments live much longer)")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "env_throughput.csv"))
    args = parser.parse_args()
    rows = []
    for engine in args.engines:
        for backend in args.backends:
            base = None
            for workers in [0, *args.workers] if backend == "process" else args.workers:
                pool = EnvPoolConfig(backend=backend, workers=workers, ray={"num_cpus": args.ray_cpus})
                r = measure(CONFIGS[engine](), pool, args.rounds, args.warmup)
                if workers == 1:
                    base = r["steps_per_s"]
                efficiency = r["steps_per_s"] / (workers * base) if workers >= 1 and base else None
                rows.append({"engine": engine, "backend": backend, "cpus": os.cpu_count(), "commit": commit(),
                             "workers": workers, "slots": r["slots"], "steps": r["steps"],
                             "steps_per_s": round(r["steps_per_s"], 1),
                             "reset_s_per_env": round(r["reset_s_per_env"], 3),
                             "efficiency": None if efficiency is None else round(efficiency, 2)})
                print(rows[-1], flush=True)
    append_rows(args.out, rows)


if __name__ == "__main__":
    main()
