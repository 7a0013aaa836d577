"""The real ALFWorld engine as TextWorld ships it against memoised (`agentrl.envs.alfworld.speedups`),
side by side in one run:

1. `play`: the same L0 games played with the same random admissible moves (an untrained agent's
   episode): seconds per reset and per step, and whether both saw the same text.
2. `expert`: the planner's episodes on train games (what SFT data and the tokenizer's corpus are
   made of): seconds per episode as shipped, memoised, and memoised in 2 worker processes
   (`rl.env_pool.workers`), with whether the three wrote the same data.

Rows are appended to benchmarks/results/alfworld_engine.csv.

    python benchmarks/alfworld_engine.py [--games 12] [--episodes 16]
"""

from __future__ import annotations

import argparse
import platform
import random
import tempfile
import time
from pathlib import Path

from results_csv import append_rows, commit

from agentrl.config import PromptConfig
from agentrl.data import collect_expert_data
from agentrl.envs import make_env
from agentrl.envs.alfworld import speedups
from agentrl.envs.alfworld.env import AlfWorldEnvConfig

DATA = "../shared/data/alfworld/alfworld_json_2.1.1_slim.tar.xz"


def play(env, games: list[str], steps: int = 30) -> tuple[float, float, list]:
    """(seconds per reset, seconds per step, everything seen)."""
    rng, seen, reset_s, step_s, n_steps = random.Random(0), [], 0.0, 0.0, 0
    for game in games:
        start = time.perf_counter()
        obs = env.reset(game)
        reset_s += time.perf_counter() - start
        seen.append((obs.text, obs.admissible_actions))
        for _ in range(steps):
            action = rng.choice(obs.admissible_actions)
            start = time.perf_counter()
            result = env.step(action)
            step_s += time.perf_counter() - start
            n_steps += 1
            obs = result.observation
            seen.append((action, obs.text, obs.admissible_actions, result.reward))
            if result.done:
                break
    return reset_s / len(games), step_s / n_steps, seen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--games", type=int, default=12, help="L0 games played (every 12th, all task types)")
    parser.add_argument("--episodes", type=int, default=16, help="expert episodes per expert row")
    args = parser.parse_args()
    config = AlfWorldEnvConfig(data=DATA, max_steps=30)
    env, prompt = make_env(config), PromptConfig()
    games = env.split_tasks("l0")[::12][:args.games]
    base = {"cpu": platform.processor() or platform.machine(), "commit": commit()}
    rows = []

    shipped = {}
    for mode in ("shipped", "memoised"):
        (speedups.uninstall if mode == "shipped" else speedups.install)()
        reset_s, step_s, shipped[mode] = play(env, games)
        rows.append({"part": "play", "mode": mode, "items": len(games), "reset_s": round(reset_s, 3),
                     "step_ms": round(1000 * step_s, 1), "episode_s": "", "same": ""})
    rows[-1]["same"] = shipped["shipped"] == shipped["memoised"]

    with tempfile.TemporaryDirectory() as tmp:
        data = {}
        for mode, workers in (("shipped", 0), ("memoised", 0), ("memoised, 2 workers", 2)):
            (speedups.uninstall if mode == "shipped" else speedups.install)()
            start = time.perf_counter()
            path = Path(tmp) / f"{workers}{mode[0]}.jsonl"
            collect_expert_data(env, prompt, args.episodes, path, 0, workers=workers, env_config=config)
            rows.append({"part": "expert", "mode": mode, "items": args.episodes, "reset_s": "", "step_ms": "",
                         "episode_s": round((time.perf_counter() - start) / args.episodes, 2), "same": ""})
            data[mode] = path.read_bytes()
        rows[-1]["same"] = len(set(data.values())) == 1
    env.close()

    for part in ("play", "expert"):
        first = next(row for row in rows if row["part"] == part)
        for row in rows:
            if row["part"] == part:
                key = "reset_s" if part == "play" else "episode_s"
                row["ratio"] = round(row[key] / first[key], 3)
                row["step_ratio"] = round(row["step_ms"] / first["step_ms"], 3) if part == "play" else ""
    for row in rows:
        row.update(base)
        print(row)
    append_rows(Path(__file__).resolve().parent / "results" / "alfworld_engine.csv", rows)


if __name__ == "__main__":
    main()
