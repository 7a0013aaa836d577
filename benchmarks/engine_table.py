"""Success per task type on a real engine, after SFT and after RL, over the seeds of a CPU pipeline
(`make alfworld-cpu SEED=k` writes runs/alfworld-cpu/seedK): successes / episodes summed over
seeds, from each run's eval/<phase>/results.json, into benchmarks/results/<name>-types.md.

    python benchmarks/engine_table.py runs/alfworld-cpu
"""

from __future__ import annotations

import argparse
import json
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
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", type=Path, help="the folder holding seed0, seed1, ...")
    args = parser.parse_args()
    out = RESULTS / f"{args.runs.name}-types.md"
    out.write_text(table(args.runs))
    print(out.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
