"""Where an RL step's time goes on a real engine, by environment-pool setting, inside the engine's
own pipeline: `agentrl train` of its CPU recipe from a model that pipeline trained, a few steps per
setting, one setting after another: environments in the trainer process (`rl.env_pool.workers=0`),
2 worker processes (the recipe's), one worker per episode, and one worker per episode with async
rollouts (`rl.rollout.mode=async`). Per setting: the median over the steps after the first (worker
start) of the step's seconds and its parts (generation, environments, sampler check, update), from
the run's metrics; rows are appended to benchmarks/results/engine_pool.csv.

    python benchmarks/engine_pool.py --model runs/alfworld-cpu-fresh/seed0/sft/model
    python benchmarks/engine_pool.py --recipe recipes/scienceworld-cpu.yaml --model runs/scienceworld-cpu/seed0/sft/model
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml
from results_csv import append_rows, commit

PARTS = {"step_s": "timing_s/step", "gen_s": "timing_s/gen", "env_s": "timing_s/env",
         "check_s": "timing_s/actor_logprobs", "update_s": "timing_s/update"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--recipe", default="recipes/alfworld-cpu.yaml")
    parser.add_argument("--model", required=True, help="the model RL starts from (a pipeline's sft/model)")
    parser.add_argument("--steps", type=int, default=4, help="RL steps per setting (the first is not counted)")
    args = parser.parse_args()
    recipe = yaml.safe_load(Path(args.recipe).read_text())
    episodes = recipe["rl"]["tasks_per_step"] * recipe["rl"]["group_size"]
    settings = {"in-process": (0, "lockstep"), "2 workers": (2, "lockstep"),
                f"{episodes} workers": (episodes, "lockstep"), f"{episodes} workers, async": (episodes, "async")}
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, (workers, mode) in settings.items():
            run_dir = Path(tmp) / str(len(rows))
            subprocess.run([sys.executable, "-m", "agentrl.cli", "train", args.recipe, "--model", args.model,
                            "--set", f"run_dir={run_dir}", "--set", f"rl.steps={args.steps}",
                            "--set", f"rl.save_every={args.steps}", "--set", "eval.episodes=1",  # train's final evaluation
                            "--set", f"rl.env_pool.workers={workers}",
                            "--set", f"rl.rollout.mode={mode}"], check=True, stdout=subprocess.DEVNULL)
            metrics = [json.loads(line) for line in (run_dir / "rl" / "logs" / "metrics.jsonl").read_text().splitlines()]
            steps = [m for m in metrics if "timing_s/step" in m][1:]
            rows.append({"engine": recipe["env"]["type"], "setting": name, "workers": workers, "mode": mode,
                         "steps": len(steps),
                         **{key: round(statistics.median(m.get(metric, 0.0) for m in steps), 2) for key, metric in PARTS.items()}})
    for row in rows:
        row.update(step_ratio=round(row["step_s"] / rows[0]["step_s"], 3), cpu=platform.processor() or platform.machine(),
                   commit=commit())
        print(row)
    append_rows(Path(__file__).resolve().parent / "results" / "engine_pool.csv", rows)


if __name__ == "__main__":
    main()
