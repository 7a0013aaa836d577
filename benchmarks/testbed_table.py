"""The testbed's report: one table over every setting `make testbed` has run, written from
benchmarks/results/testbed-SETTING.json (the comparison) and testbed-SETTING-coldstart.json (the
setting's overrides and its cold start's evaluation) into benchmarks/results/testbed.md.

    python benchmarks/testbed_table.py

Each method is compared with the baseline (GRPO) by its paired difference over seeds, in points,
with the 95% bootstrap interval and the minimum detectable difference at the seeds used.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
BASELINE = "grpo"


def oriented(pairs: dict, method: str) -> dict[str, dict]:
    """The pair `method - BASELINE` per split, whichever way round the comparison wrote it."""
    if f"{method} - {BASELINE}" in pairs:
        return pairs[f"{method} - {BASELINE}"]
    flipped = pairs[f"{BASELINE} - {method}"]
    return {split: {**row, "difference": -row["difference"], "ci95": [-row["ci95"][1], -row["ci95"][0]]}
            for split, row in flipped.items()}


def cell(row: dict) -> str:
    low, high = (100 * x for x in row["ci95"])
    star = "*" if (low > 0 or high < 0) and len(row["per_seed"]) >= 2 else ""
    mdd = "-" if row["mdd"] is None else f"{100 * row['mdd']:.0f}"
    return f"{100 * row['difference']:+.1f} [{low:+.1f}, {high:+.1f}]{star} ({mdd})"


def table(results: Path = RESULTS) -> str:
    lines = ["| setting | overrides | split | SFT | GRPO, mean [95% CI] | difference - GRPO [95% CI] (MDD) | seeds |",
             "|---|---|---|---|---|---|---|"]
    for path in sorted(results.glob("testbed-*.json")):
        if path.stem.endswith("-coldstart"):
            continue
        setting = path.stem.removeprefix("testbed-")
        summary = json.loads(path.read_text())
        coldstart = json.loads((results / f"testbed-{setting}-coldstart.json").read_text())
        others = [m for m in summary["methods"] if m != BASELINE]
        for split in summary["splits"]:
            base = summary["methods"][BASELINE][split]
            low, high = (100 * x for x in base["ci95"])
            differences = "<br>".join(f"{m}: {cell(oriented(summary['pairs'], m)[split])}" for m in others)
            lines.append(f"| {setting} | `{coldstart['set'] or 'defaults'}` | {split.upper()} | "
                         f"{100 * coldstart['sft'][split]['success']:.0f} | {100 * base['mean']:.1f} "
                         f"[{low:.1f}, {high:.1f}] | {differences} | {len(base['per_seed'])} |")
    return "\n".join(lines) + ("\n\nPoints of success. `*`: the paired interval excludes 0. MDD: the smallest "
                               "difference these seeds detect with 80% power ('-': no spread to size it by). "
                               "SFT: the setting's cold start, the starting point of every run.\n")


def main() -> int:
    out = RESULTS / "testbed.md"
    out.write_text(table())
    print(f"written: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
