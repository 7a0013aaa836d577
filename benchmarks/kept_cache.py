"""Generation with full-history prompts: the sampler keeping each episode's cache across turns
(`rl.sampler.keep_cache_mib`) against prefilling every prompt whole, and against the 2-step window,
side by side in one run.

For each environment, the same pool and the same tiny random-init model (the demo's starting model,
or `--model`) play one rollout of G groups x K episodes three ways, each from the same seed:

- window: the default prompt (the task, the last 2 steps, the observation), nothing kept;
- full, whole: `prompt.full_history`, every prompt prefilled whole (the shared decoder still
  computes what a batch's prompts share once);
- full, kept: `prompt.full_history` with the kept cache: each turn prefills only the new user turn.

A random-init model rarely names an admissible action, so episodes run to the step limit and every
reply is `--new-tokens` long: the longest episodes, which is what the cache is for. Reported per
way: seconds in the sampler (`gen`), prompt tokens given to the sampler, and (kept) prompt tokens
computed; the ratios full-whole / full-kept and full-kept / window. One untimed rollout first.
Rows are appended to benchmarks/results/kept_cache.csv.

    python benchmarks/kept_cache.py                         # household and real ALFWorld, 4 x 4, 8 steps
    python benchmarks/kept_cache.py --envs household --max-steps 12
"""

from __future__ import annotations

import argparse
import os
import random
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
from agentrl.envs.pool import EnvPool
from agentrl.models import init_tiny_model, load_model, load_tokenizer
from agentrl.rollout.collect import collect
from agentrl.sampler.hf import HFSampler

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"
WAYS = {"window": (PromptConfig(), 0), "full_whole": (PromptConfig(full_history=True, history_length=0), 0),
        "full_kept": (PromptConfig(full_history=True, history_length=0), 1024)}


def env_config(name: str, steps: int):
    if name == "alfworld":
        return AlfWorldEnvConfig(data=str(SHARED / "alfworld" / "alfworld_json_2.1.1_slim.tar.xz"), max_steps=steps)
    return HouseholdEnvConfig(max_steps=steps)


def rollout(pool, sampler, tokenizer, tasks, prompt, args, seed: int) -> dict:
    torch.manual_seed(seed)
    timing = {}
    start = time.perf_counter()
    trajectories = collect(pool, sampler, tokenizer, tasks, args.group_size, prompt,
                           SamplingConfig(temperature=1.0, max_new_tokens=args.new_tokens), timing=timing)
    steps = [s for t in trajectories for s in t.steps]
    return {"wall_s": time.perf_counter() - start, "gen_s": timing["gen"], "steps": len(steps),
            "prompt_tokens": sum(len(s.prompt_ids) for s in steps),
            "longest_prompt": max(len(s.prompt_ids) for s in steps)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--envs", nargs="+", default=["household", "alfworld"])
    parser.add_argument("--groups", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--max-steps", type=int, default=8, help="step limit (the tiny model has 4,096 positions)")
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--model", help="a model folder (default: a tiny random-init model, made here)")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "kept_cache.csv"))
    args = parser.parse_args()
    threads = os.cpu_count() or 1
    torch.set_num_threads(threads)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = args.model or init_tiny_model(Path(tmp) / "model", TinyModelConfig(),
                                                  make_env(HouseholdEnvConfig()), PromptConfig())
        tokenizer, model = load_tokenizer(model_dir), load_model(model_dir)
        rows = []
        for name in args.envs:
            with EnvPool(env_config(name, args.max_steps), EnvPoolConfig(workers=2)) as pool:
                tasks = sample_tasks(pool.local, "train", args.groups, random.Random(0))
                measured = {}
                for way, (prompt, keep) in WAYS.items():
                    sampler = HFSampler(model, tokenizer, keep_mib=keep)
                    if way == "window":
                        rollout(pool, sampler, tokenizer, tasks, prompt, args, seed=0)  # warm-up, untimed
                    measured[way] = rollout(pool, sampler, tokenizer, tasks, prompt, args, seed=1)
                    if sampler.kept is not None:
                        measured[way]["computed_tokens"] = sampler.kept.computed
            row = {"env": name, "threads": threads, "commit": commit(), "groups": args.groups,
                   "group_size": args.group_size, "max_steps": args.max_steps, "new_tokens": args.new_tokens}
            for way, m in measured.items():
                row.update({f"{way}_{key}": round(value, 3) for key, value in m.items()})
            row["whole_over_kept"] = round(measured["full_whole"]["gen_s"] / measured["full_kept"]["gen_s"], 2)
            row["kept_over_window"] = round(measured["full_kept"]["gen_s"] / measured["window"]["gen_s"], 2)
            rows.append(row)
            print(f"{name}: generation s: window {measured['window']['gen_s']:.2f}, full whole "
                  f"{measured['full_whole']['gen_s']:.2f}, full kept {measured['full_kept']['gen_s']:.2f} "
                  f"(whole / kept {row['whole_over_kept']:.2f}x, kept / window {row['kept_over_window']:.2f}x); "
                  f"longest prompt {measured['full_kept']['longest_prompt']} tokens", flush=True)
    append_rows(args.out, rows)


if __name__ == "__main__":
    main()
