"""One rollout of G groups x K episodes in lock-step vs async (`rl.rollout.mode`), side by side.

For each environment, the same pool (one worker process per episode) and the same sampler play
one untimed rollout first (worker start, the JVM's JIT), then lock-step and async rollouts in
turn, `--repeats` of each; the wall times' medians and their ratio (lock-step / async: > 1 means
async is faster) are printed and appended to benchmarks/results/rollout_modes.csv, with where
the time went (`gen`: in the sampler; `env`: waiting for environments).

Environments: `latency` (the household env behind a log-normal step latency: median
`--latency-median` s, shape `--latency-sigma`; the mechanism apart from any engine), and the real
engines household, alfworld, scienceworld. The sampler is HF generate on the tiny random-init
model the demo starts from (or `--model`), sampling at temperature 1.

    python benchmarks/rollout_modes.py                                   # all environments, 4 x 4
    python benchmarks/rollout_modes.py --envs latency --groups 8 --group-size 8
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch
from results_csv import append_rows, commit

from agentrl.config import EnvPoolConfig, PromptConfig, SamplingConfig, TinyModelConfig
from agentrl.envs import make_env
from agentrl.envs.alfworld.env import AlfWorldEnvConfig
from agentrl.envs.base import sample_tasks
from agentrl.envs.household.env import HouseholdEnvConfig
from agentrl.envs.latency import LatencyEnvConfig
from agentrl.envs.pool import EnvPool
from agentrl.envs.scienceworld.env import ScienceWorldEnvConfig
from agentrl.models import init_tiny_model, load_model, load_tokenizer
from agentrl.rollout.collect import collect
from agentrl.sampler.hf import HFSampler

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"


def env_configs(args) -> dict:
    steps = args.max_steps
    return {
        "latency": lambda: LatencyEnvConfig(inner=HouseholdEnvConfig(max_steps=steps), step_median_s=args.latency_median,
                                            step_sigma=args.latency_sigma),
        "household": lambda: HouseholdEnvConfig(max_steps=steps),
        "alfworld": lambda: AlfWorldEnvConfig(data=str(SHARED / "alfworld" / "alfworld_json_2.1.1_slim.tar.xz"),
                                              max_steps=steps),
        "scienceworld": lambda: ScienceWorldEnvConfig(splits_dir=str(SHARED / "scienceworld"), max_steps=steps),
    }


def rollout(pool, sampler, tokenizer, tasks, args, mode: str, seed: int) -> dict:
    torch.manual_seed(seed)
    timing = {}
    start = time.perf_counter()
    trajectories = collect(pool, sampler, tokenizer, tasks, args.group_size, PromptConfig(),
                           SamplingConfig(temperature=1.0, max_new_tokens=args.new_tokens), timing=timing, mode=mode,
                           batch_window_s=args.batch_window)
    return {"wall_s": time.perf_counter() - start, "gen_s": timing["gen"], "env_s": timing["env"],
            "steps": sum(len(t.steps) for t in trajectories), "aborted": sum(t.aborted for t in trajectories)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--envs", nargs="+", default=["latency", "household", "alfworld", "scienceworld"])
    parser.add_argument("--groups", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--max-steps", type=int, default=10, help="step limit of every episode")
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batch-window", type=float, default=0.02, help="rl.rollout.batch_window_s of async")
    parser.add_argument("--latency-median", type=float, default=0.1)
    parser.add_argument("--latency-sigma", type=float, default=1.0)
    parser.add_argument("--model", help="a model folder (default: a tiny random-init model, made here)")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "rollout_modes.csv"))
    args = parser.parse_args()
    torch.set_num_threads(os.cpu_count() or 1)
    configs = env_configs(args)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = args.model or init_tiny_model(Path(tmp) / "model", TinyModelConfig(),
                                                  make_env(HouseholdEnvConfig()), PromptConfig())
        tokenizer = load_tokenizer(model_dir)
        sampler = HFSampler(load_model(model_dir), tokenizer)
        rows = []
        for name in args.envs:
            slots = args.groups * args.group_size
            with EnvPool(configs[name](), EnvPoolConfig(workers=slots)) as pool:
                tasks = sample_tasks(pool.local, "train", args.groups, __import__("random").Random(0))
                rollout(pool, sampler, tokenizer, tasks, args, "async", seed=0)  # warm-up, untimed
                runs = {"lockstep": [], "async": []}
                for repeat in range(args.repeats):
                    for mode in runs:
                        runs[mode].append(rollout(pool, sampler, tokenizer, tasks, args, mode, seed=repeat + 1))
            median = {mode: {key: statistics.median(r[key] for r in rs) for key in rs[0]} for mode, rs in runs.items()}
            row = {"env": name, "cpus": os.cpu_count(), "commit": commit(), "groups": args.groups,
                   "group_size": args.group_size, "max_steps": args.max_steps, "new_tokens": args.new_tokens,
                   "repeats": args.repeats}
            for mode, m in median.items():
                row.update({f"{mode}_{key}": round(value, 3) for key, value in m.items()})
            row["speedup"] = round(median["lockstep"]["wall_s"] / median["async"]["wall_s"], 2)
            rows.append(row)
            print(f"{name}: lock-step {row['lockstep_wall_s']:.2f} s (gen {row['lockstep_gen_s']:.2f}, env "
                  f"{row['lockstep_env_s']:.2f}), async {row['async_wall_s']:.2f} s (gen {row['async_gen_s']:.2f}, "
                  f"env {row['async_env_s']:.2f}): async {row['speedup']:.2f}x", flush=True)
    append_rows(args.out, rows)


if __name__ == "__main__":
    main()
