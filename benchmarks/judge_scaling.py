"""What it takes for GCD's generative judge to beat chance on the testbed: judge accuracy of the cold
start (SFT on expert data plus judgment examples) by model size and number of judgment examples.

    python benchmarks/judge_scaling.py [--sizes tiny wide] [--judgments 200 2000]

For each (size, judgments): `agentrl run recipes/testbed.yaml` up to SFT (the `hint50` setting of
the testbed report, where GCD's comparison ran), then `agentrl train` with no RL step evaluates that
model with the GCD judge attached, which measures judge accuracy on a balanced
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

from agentrl.compare import read_run

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


def measure(size: str, judgments: int) -> dict:
    run = ROOT / "runs" / "judge-scaling" / f"{size}-j{judgments}"
    sets = [*SETTING, *SIZES[size], f"sft.judgments={judgments}", "rl.steps=0", f"run_dir={run}/coldstart",
            f"model.path={run}/coldstart/model-init"]
    subprocess.run([AGENTRL, "run", "recipes/testbed.yaml", *(x for s in sets for x in ("--set", s))],
                   cwd=ROOT, check=True)
    judge = [*SETTING, "eval.episodes=40", "rl.steps=0", f"rl.aux=[{GCD}]", f"run_dir={run}/judge"]
    subprocess.run([AGENTRL, "train", "recipes/testbed.yaml", "--model", f"{run}/coldstart/sft/model",
                    "--overwrite", *(x for s in judge for x in ("--set", s))], cwd=ROOT, check=True)
    evaluated = read_run(run / "judge" / "rl")  # no RL step: the cold start, evaluated with the judge attached
    return {"size": size, "judgments": judgments,
            "parameters": parameters(run / "coldstart" / "sft" / "model"),
            "judge_accuracy": {s: evaluated.extras[s].get("judge_accuracy") for s in evaluated.outcomes},
            "verdict_parse_rate": _parse_rates(run / "judge" / "rl"),
            "success": {s: sum(o.values()) / len(o) for s, o in evaluated.outcomes.items()}}


def _parse_rates(run_dir: Path) -> dict:
    """Each split's share of the judge's verdicts that parsed (its evaluation results file)."""
    (results,) = sorted((run_dir / "eval").glob("step_*/results.json"))[-1:]
    return {s: r.get("verdict_parse_rate") for s, r in json.loads(results.read_text()).items()}


def markdown(rows: list[dict]) -> str:
    lines = ["| model | parameters | judgment examples | judge accuracy L0 / L1 / L2 (%, chance 50) | "
             "verdicts parsed L0 / L1 / L2 (%) | success L0 / L1 / L2 (%) |", "|---|---|---|---|---|---|"]
    for r in rows:
        acc = " / ".join("-" if v is None else f"{100 * v:.0f}" for v in r["judge_accuracy"].values())
        parsed = " / ".join("-" if v is None else f"{100 * v:.0f}" for v in r.get("verdict_parse_rate", {}).values())
        win = " / ".join(f"{100 * v:.0f}" for v in r["success"].values())
        lines.append(f"| {r['size']} | {r['parameters'] / 1e6:.2f}M | {r['judgments']} | {acc} | {parsed or '-'} | "
                     f"{win} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", nargs="+", default=list(SIZES), choices=list(SIZES))
    parser.add_argument("--judgments", nargs="+", type=int, default=[200, 2000])
    args = parser.parse_args()
    out = RESULTS / "judge-scaling.json"
    rows = json.loads(out.read_text()) if out.exists() else []
    for size in args.sizes:
        for judgments in args.judgments:
            if any(r["size"] == size and r["judgments"] == judgments for r in rows):
                continue
            rows.append(measure(size, judgments))
            out.write_text(json.dumps(rows, indent=1))
            (RESULTS / "judge-scaling.md").write_text(markdown(rows))
            print(markdown(rows), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
