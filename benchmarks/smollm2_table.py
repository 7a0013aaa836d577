"""SmolLM2 on real ALFWorld per seed and phase (`make alfworld-smollm2 SEED=k`), from each run's
evaluation files into benchmarks/results/alfworld-smollm2.csv (the environments guide's table),
replacing the rows of the phases evaluated again and keeping the others.

    python benchmarks/smollm2_table.py [runs/alfworld-smollm2 [OUT.csv]]

(the GPU run of benchmarks/gpu_smollm2.sh: runs/alfworld-smollm2-gpu into alfworld-smollm2-gpu.csv)
"""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

from agentrl.evaluate import summarize
from agentrl.rollout.records import read_trajectories

RESULTS = Path(__file__).resolve().parent / "results" / "alfworld-smollm2.csv"


def phase_results(folder: Path) -> dict:
    """A phase's evaluation: its results.json, or, where the evaluation stopped before writing it
    (a device call's time ran out), the splits whose trajectories were written."""
    if (folder / "results.json").is_file():
        return json.loads((folder / "results.json").read_text())
    return {path.stem.removeprefix("trajectories_"): summarize(read_trajectories(path))
            for path in sorted(folder.glob("trajectories_*.jsonl"))}


def rows(runs: Path) -> list[dict]:
    found = []
    for seed in sorted(runs.glob("seed*")):
        for phase in ("initial", "sft", "rl"):
            results = phase_results(seed / "eval" / phase)
            if not results:
                continue
            row = {"seed": seed.name.removeprefix("seed"), "phase": "zero-shot" if phase == "initial" else phase,
                   "l0": "not evaluated", "l1": "not evaluated"}
            for split, r in results.items():
                wins = round(r["success"] * r["episodes"])
                low, high = r["ci95"]
                row[split] = f"{wins} / {r['episodes']} = {100 * r['success']:.1f}% [{100 * low:.1f}, {100 * high:.1f}]"
            found.append(row)
    return found


def merged(kept: list[dict], found: list[dict]) -> list[dict]:
    """The table's rows with those of every (seed, phase) measured again replaced: a run that skips
    a phase (the zero-shot evaluation, `eval.initial: false`) keeps that phase's earlier row."""
    measured = {(row["seed"], row["phase"]) for row in found}
    order = {"zero-shot": 0, "sft": 1, "rl": 2}
    return sorted([row for row in kept if (row["seed"], row["phase"]) not in measured] + found,
                  key=lambda row: (int(row["seed"]), order[row["phase"]]))


def main() -> None:
    found = rows(Path(sys.argv[1] if len(sys.argv) > 1 else "runs/alfworld-smollm2"))
    if not found:
        raise SystemExit("no evaluated phase found")
    out = Path(sys.argv[2] if len(sys.argv) > 2 else RESULTS)
    kept = list(csv.DictReader(out.open())) if out.is_file() else []
    table = merged(kept, found)
    with out.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(found[0]))
        writer.writeheader()
        writer.writerows(table)


if __name__ == "__main__":
    main()
