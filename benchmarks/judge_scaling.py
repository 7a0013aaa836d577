"""What it takes for GCD's generative judge to beat chance on the testbed: judge accuracy of the cold
start (SFT on expert data plus judgment examples) by model size and number of judgment examples.

    python benchmarks/judge_scaling.py [--sizes tiny wide] [--judgments 200 2000] [--seeds 1]

For each (size, judgments): `agentrl run recipes/testbed.yaml` up to SFT (the `hint50` setting of
the testbed report, where GCD's comparison ran), then `agentrl compare` evaluates that model as the
method `sft` (no RL step) with the GCD judge attached, which measures judge accuracy on a balanced
sample of labelled steps of the evaluation episodes (greedy verdicts; chance is 50%). Results:
benchmarks/results/judge-scaling.{json,md}, one row per setting, written as each one finishes (a
rerun skips the finished ones).
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
AGENTRL = str(Path(sys.executable).with_name("agentrl"))
SETTING = ["env.hint_rate=0.5", "env.doors=3", "env.slack=3", "prompt.history_length=2"]
SIZES = {"tiny": ["init.hidden_size=128", "init.layers=2", "init.intermediate_size=256"],
         "wide": ["init.hidden_size=256", "init.layers=4", "init.intermediate_size=1024"]}
GCD = "{type: gcd, labels: [rules, env], pairs_per_step: 16, eval_pairs: 100}"


def parameters(model_dir: Path) -> int:
    from safetensors import safe_open

    with safe_open(str(model_dir / "model.safetensors"), "pt") as f:
        return sum(math.prod(f.get_slice(name).get_shape()) for name in f.keys())


def measure(size: str, judgments: int, seeds: list[int]) -> dict:
    run = ROOT / "runs" / "judge-scaling" / f"{size}-j{judgments}"
    sets = [*SETTING, *SIZES[size], f"sft.judgments={judgments}", "rl.steps=0", f"run_dir={run}/coldstart",
            f"model.path={run}/coldstart/model-init"]
    subprocess.run([AGENTRL, "run", "recipes/testbed.yaml", *(x for s in sets for x in ("--set", s))],
                   cwd=ROOT, check=True)
    compare = [AGENTRL, "compare", "recipes/testbed.yaml", "--model", f"{run}/coldstart/sft/model", "--out",
               f"{run}/compare", "--seeds", *map(str, seeds), "--method", f"sft:rl.steps=0;rl.aux=[{GCD}]",
               *(x for s in [*SETTING, "eval.episodes=40"] for x in ("--set", s))]
    subprocess.run(compare, cwd=ROOT, check=True)
    summary = json.loads((run / "compare" / "summary.json").read_text())
    sft = summary["methods"]["sft"]
    return {"size": size, "judgments": judgments, "seeds": seeds,
            "parameters": parameters(run / "coldstart" / "sft" / "model"),
            "judge_accuracy": {s: sft[s].get("judge_accuracy") for s in summary["splits"]},
            "success": {s: sft[s]["mean"] for s in summary["splits"]}}


def markdown(rows: list[dict]) -> str:
    lines = ["| model | parameters | judgment examples | judge accuracy L0 / L1 / L2 (%, chance 50) | "
             "success L0 / L1 / L2 (%) |", "|---|---|---|---|---|"]
    for r in rows:
        acc = " / ".join("-" if v is None else f"{100 * v:.0f}" for v in r["judge_accuracy"].values())
        win = " / ".join(f"{100 * v:.0f}" for v in r["success"].values())
        lines.append(f"| {r['size']} | {r['parameters'] / 1e6:.2f}M | {r['judgments']} | {acc} | {win} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", nargs="+", default=list(SIZES), choices=list(SIZES))
    parser.add_argument("--judgments", nargs="+", type=int, default=[200, 2000])
    parser.add_argument("--seeds", nargs="+", type=int, default=[1])
    args = parser.parse_args()
    out = RESULTS / "judge-scaling.json"
    rows = json.loads(out.read_text()) if out.exists() else []
    for size in args.sizes:
        for judgments in args.judgments:
            if any(r["size"] == size and r["judgments"] == judgments and r["seeds"] == args.seeds for r in rows):
                continue
            rows.append(measure(size, judgments, args.seeds))
            out.write_text(json.dumps(rows, indent=1))
            (RESULTS / "judge-scaling.md").write_text(markdown(rows))
            print(markdown(rows), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
