"""The testbed's report: one table over every setting `make testbed` has run, written from
benchmarks/results/testbed-SETTING.json (the comparison) and testbed-SETTING-coldstart.json (the
setting's overrides and its cold start's evaluation) into benchmarks/results/testbed.md.

    python benchmarks/testbed_table.py

Each method is compared with the baseline (GRPO) by its paired difference over seeds, in points,
with the 95% bootstrap interval, the paired t-interval and the minimum detectable difference at the seeds used; GRPO with
the cold start itself (the method `sft`: no RL step, evaluated at each seed) by GRPO - SFT.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from agentrl.stats import t_interval

RESULTS = Path(__file__).resolve().parent / "results"
BASELINE = "grpo"
START = "sft"


def oriented(pairs: dict, a: str, b: str, split: str) -> dict:
    """The pair `a - b` on `split`, whichever way round the comparison wrote it."""
    if f"{a} - {b}" in pairs:
        return pairs[f"{a} - {b}"][split]
    row = pairs[f"{b} - {a}"][split]
    return {**row, "difference": -row["difference"], "ci95": [-row["ci95"][1], -row["ci95"][0]],
            "per_seed": [-d for d in row["per_seed"]]}


def _interval(low: float, high: float, seeds: int) -> str:
    star = "*" if (low > 0 or high < 0) and seeds >= 2 else ""
    return f"[{100 * low:+.1f}, {100 * high:+.1f}]{star}"


def cell(row: dict) -> str:
    seeds = len(row["per_seed"])
    mdd = "-" if row["mdd"] is None else f"{100 * row['mdd']:.0f}"
    t = _interval(*t_interval(row["per_seed"]), seeds)
    return f"{100 * row['difference']:+.1f} {_interval(*row['ci95'], seeds)} t {t} ({mdd})"


def table(results: Path = RESULTS) -> str:
    lines = ["| setting | overrides | split | SFT | GRPO, mean [95% CI] | paired difference [95% CI] t [95% CI] (MDD) "
             "| seeds |",
             "|---|---|---|---|---|---|---|"]
    for path in sorted(results.glob("testbed-*.json")):
        if path.stem.endswith("-coldstart"):
            continue
        setting = path.stem.removeprefix("testbed-")
        summary = json.loads(path.read_text())
        coldstart = json.loads((results / f"testbed-{setting}-coldstart.json").read_text())
        methods = summary["methods"]
        pairs = [(BASELINE, START)] if START in methods else []
        pairs += [(m, BASELINE) for m in methods if m not in (BASELINE, START)]
        for split in summary["splits"]:
            base = methods[BASELINE][split]
            low, high = (100 * x for x in base["ci95"])
            start = methods[START][split]["mean"] if START in methods else coldstart["sft"][split]["success"]
            differences = "<br>".join(f"{a} - {b}: {cell(oriented(summary['pairs'], a, b, split))}" for a, b in pairs)
            judged = [f"{m} {100 * methods[m][split]['judge_accuracy']:.0f}" for m in methods
                      if "judge_accuracy" in methods[m][split]]
            differences += f"<br>judge accuracy (%, chance 50): {', '.join(judged)}" if judged else ""
            overrides = f"`{coldstart['set'] or 'defaults'}`"
            if coldstart.get("coldstart_set"):
                overrides += f"; cold start: `{coldstart['coldstart_set']}`"
            lines.append(f"| {setting} | {overrides} | {split.upper()} | "
                         f"{100 * start:.0f} | {100 * base['mean']:.1f} "
                         f"[{low:.1f}, {high:.1f}] | {differences} | {len(base['per_seed'])} |")
    return "\n".join(lines) + ("\n\nPoints of success. Each paired difference has its percentile-bootstrap "
                               "interval over seeds and its paired t-interval (wider at 5 seeds, where the bootstrap "
                               "covers less than 95%). `*`: the interval excludes 0. MDD: the smallest "
                               "difference these seeds detect with 80% power ('-': no spread to size it by). "
                               "SFT: the setting's cold start, the starting point of every run (mean over the "
                               "seeds' evaluations where the comparison has it, else its own evaluation).\n")


def main() -> int:
    out = RESULTS / "testbed.md"
    out.write_text(table())
    print(f"written: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
