"""Success per task type on a real engine, after SFT and after RL, over the seeds of a CPU pipeline
(`make alfworld-cpu SEED=k` writes runs/alfworld-cpu/seedK): successes / episodes summed over
seeds, from each run's eval/<phase>/results.json, into benchmarks/results/<name>-types.md; and
where the time went (each phase's minutes, from logs/phase_seconds.json, and each RL step's parts,
from rl/logs/metrics.jsonl) into benchmarks/results/<name>-time.md.

    python benchmarks/engine_table.py runs/alfworld-cpu
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
PHASES = ("sft", "rl")


def table(runs: Path) -> str:
    seeds = sorted(p for p in runs.glob("seed*") if all((p / "eval" / ph / "results.json").is_file() for ph in PHASES))
    if not seeds:
        raise SystemExit(f"{runs}: no seed folder with both evaluations (eval/sft, eval/rl)")
    counts = defaultdict(lambda: [0, 0])  # (split, type, phase) -> successes, episodes
    splits: list[str] = []
    for seed in seeds:
        for phase in PHASES:
            results = json.loads((seed / "eval" / phase / "results.json").read_text())
            for split, r in results.items():
                splits += [split] if split not in splits else []
                for kind, c in r["per_task_type_counts"].items():
                    for key in ((split, kind, phase), (split, "all", phase)):
                        counts[key][0] += c["success"]
                        counts[key][1] += c["episodes"]
    kinds = sorted({kind for _, kind, _ in counts if kind != "all"}) + ["all"]
    lines = [f"Successes / episodes over {len(seeds)} seed(s) ({', '.join(s.name for s in seeds)}), after SFT -> "
             "after RL.", "", "| task type | " + " | ".join(s.upper() for s in splits) + " |",
             "|---" * (len(splits) + 1) + "|"]
    for kind in kinds:
        cells = []
        for split in splits:
            sft, rl = counts.get((split, kind, "sft")), counts.get((split, kind, "rl"))
            cells.append("-" if sft is None else f"{sft[0]}/{sft[1]} -> {rl[0]}/{rl[1]}")
        lines.append(f"| {kind if kind != 'all' else '**all**'} | " + " | ".join(cells) + " |")
    for name, clip in (("return", False), ("score (return clipped at 0)", True)):
        cells = [f"{_mean_return(seeds, 'sft', split, clip):.1f} -> {_mean_return(seeds, 'rl', split, clip):.1f}"
                 for split in splits]
        lines.append(f"| mean {name} per episode | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _mean_return(seeds: list[Path], phase: str, split: str, clip: bool = False) -> float:
    """Mean over the seeds' finished episodes of their summed environment rewards (ALFWorld: 10 x
    success; ScienceWorld: the final score), or with `clip` of their scores (`Trajectory.score`:
    clipped at 0), from the evaluation's trajectories."""
    from agentrl.rollout.records import read_trajectories

    returns = []
    for seed in seeds:
        # The RL phase's final evaluation writes its trajectories beside its checkpoints.
        folder = seed / "eval" / "sft" if phase == "sft" else sorted((seed / "rl" / "eval").glob("step_*"))[-1]
        returns += [t.score if clip else t.episode_reward
                    for t in read_trajectories(folder / f"trajectories_{split}.jsonl") if not t.aborted]
    return statistics.fmean(returns) if returns else float("nan")


STEP_PARTS = {"timing_s/env": "environments (resets and steps)", "timing_s/gen": "generation",
              "timing_s/actor_logprobs": "sampler check (actor log-probs)", "timing_s/update": "update"}


def time_table(runs: Path) -> str:
    from agentrl.tracking import read_metrics

    seeds = sorted(p for p in runs.glob("seed*") if (p / "logs" / "phase_seconds.json").is_file())
    phases = [json.loads((seed / "logs" / "phase_seconds.json").read_text()) for seed in seeds]
    names = list(dict.fromkeys(name for seconds in phases for name in seconds))
    lines = [f"Minutes per phase, median over {len(seeds)} seed(s) (min-max); `rl` includes its final evaluation.", "",
             "| phase | minutes |", "|---|---|"]
    for name in names:
        values = [seconds[name] / 60 for seconds in phases if name in seconds]
        lines.append(f"| {name} | {statistics.median(values):.1f} ({min(values):.1f}-{max(values):.1f}) |")
    steps = [row for seed in seeds if (seed / "rl" / "logs" / "metrics.jsonl").is_file()
             for row in read_metrics(seed / "rl" / "logs" / "metrics.jsonl") if "timing_s/step" in row]
    if steps:
        step = statistics.median(row["timing_s/step"] for row in steps)
        lines += ["", f"One RL step: median {step:.1f} s over {len(steps)} steps; its parts (median s, share of the median step):",
                  "", "| part | seconds | share |", "|---|---|---|"]
        for key, label in STEP_PARTS.items():
            part = statistics.median(row.get(key, 0.0) for row in steps)
            lines.append(f"| {label} | {part:.1f} | {part / step:.0%} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", type=Path, help="the folder holding seed0, seed1, ...")
    args = parser.parse_args()
    out = RESULTS / f"{args.runs.name}-types.md"
    out.write_text(table(args.runs))
    print(out.read_text())
    times = RESULTS / f"{args.runs.name}-time.md"
    times.write_text(time_table(args.runs))
    print(times.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
