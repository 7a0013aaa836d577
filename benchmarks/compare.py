"""Methods side by side: RL from one cold-start checkpoint, several seeds per variant, equal budget.

    python benchmarks/compare.py --recipe recipes/compare.yaml --model runs/coldstart/sft/model \
        --out runs/compare --seeds 1 2 3 \
        --variant grpo: --variant gcd:rl.aux=[{type: gcd}]

A variant is `name:override;override;...` (overrides as for `agentrl --set`; empty for the recipe
as is). `--import my_plugin.py` (repeatable) loads your own estimators, losses or environments
first, so a variant can name them. Each (variant, seed) trains in <out>/<name>/seed<k>; a finished
run is reused only when its settings and starting model are unchanged (else it is redone). The
summary pools the seeds' evaluation episodes per split (success with a 95% Wilson interval, plus
the per-seed spread) and, where the runs logged it, judge accuracy; written to <out>/summary.json
and <out>/summary.md, with learning curves in <out>/curves.png when matplotlib is installed.
`--coupling TRAJECTORIES.jsonl` adds the coupling lab's numbers (gradient cosine of good vs bad
steps, influence gap, representation separation) on those fixed steps, for the cold start and for
every run's final model (mean over seeds).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
from pathlib import Path

from agentrl.analysis.coupling import coupling_metrics
from agentrl.checkpoint import latest_checkpoint
from agentrl.config import ConfigError, load_config, save_config
from agentrl.evaluate import wilson_interval
from agentrl.models import load_model, load_tokenizer
from agentrl.pipeline import rl_settings, train_rl
from agentrl.provenance import Phases, config_settings, folder_fingerprint
from agentrl.rollout.records import read_trajectories
from agentrl.tracking import read_metrics


def train_once(recipe: str, model: str, overrides: list[str], imports: list[str], seed: int, run_dir: Path) -> dict:
    config = load_config(recipe, [*overrides, f"seed={seed}", f"run_dir={run_dir}"], imports)
    settings = {**rl_settings(config), **config_settings(config, "rl.steps", "eval"), "model.path": model,
                "model.fingerprint": folder_fingerprint(model)}
    done = run_dir / "results.json"
    phases = Phases(run_dir, say=lambda line: print(f"{run_dir}: {line}"))
    if phases.reusable("run", settings, done.exists()):
        return json.loads(done.read_text())
    if phases.done.get("started") != settings:  # a stopped run resumes only with the same settings
        for path in (run_dir / "checkpoints", run_dir / "logs", run_dir / "eval"):
            shutil.rmtree(path, ignore_errors=True)
        phases.complete("started", settings)
    results = train_rl(config, model, run_dir, resume=True)
    done.write_text(json.dumps(results, indent=2))
    save_config(config, run_dir / "config.yaml")
    phases.complete("run", settings)
    return results


def pooled(per_seed: list[dict]) -> dict:
    out = {}
    for split in per_seed[0]:
        wins = sum(round(r[split]["success"] * r[split]["episodes"]) for r in per_seed)
        n = sum(r[split]["episodes"] for r in per_seed)
        rates = [r[split]["success"] for r in per_seed]
        out[split] = {"success": wins / n, "ci95": wilson_interval(wins, n), "episodes": n,
                      "per_seed": rates, "seed_std": statistics.pstdev(rates)}
        judged = [r[split]["judge_accuracy"] for r in per_seed if "judge_accuracy" in r[split]]
        if judged:
            out[split]["judge_accuracy"] = statistics.fmean(judged)
    return out


def coupling_of(model_path, trajectories, pairs: int) -> dict[str, float]:
    return coupling_metrics(load_model(str(model_path)), load_tokenizer(str(model_path)), trajectories, pairs,
                            1e-3, seed=0)


def coupling_table(coupling: dict[str, dict]) -> str:
    keys = ["grad_cos_pos_neg", "influence_gap", "separation"]
    lines = ["| model | " + " | ".join(keys) + " |", "|---" * (len(keys) + 1) + "|"]
    for name, values in coupling.items():
        lines.append(f"| {name} | " + " | ".join(f"{values[k]:.4g}" for k in keys) + " |")
    return "\n".join(lines)


def markdown(summary: dict) -> str:
    splits = list(next(iter(summary.values())))
    lines = ["| method | " + " | ".join(s.upper() for s in splits) + " |", "|---" * (len(splits) + 1) + "|"]
    for name, result in summary.items():
        cells = []
        for s in splits:
            r = result[s]
            cell = f"{r['success'] * 100:.1f}% [{r['ci95'][0] * 100:.0f}-{r['ci95'][1] * 100:.0f}]"
            if "judge_accuracy" in r:
                cell += f", judge {r['judge_accuracy'] * 100:.0f}%"
            cells.append(cell)
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot_curves(out: Path, runs: dict[str, list[Path]]) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no curves.png")
        return
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, dirs in runs.items():
        curves = [[r["rollout/success"] for r in read_metrics(d / "logs" / "metrics.jsonl")] for d in dirs]
        steps = min(len(c) for c in curves)
        mean = [statistics.fmean(c[i] for c in curves) for i in range(steps)]
        smooth = [statistics.fmean(mean[max(0, i - 4):i + 1]) for i in range(steps)]
        ax.plot(range(1, steps + 1), smooth, label=f"{name} ({len(dirs)} seeds)")
    ax.set_xlabel("RL step")
    ax.set_ylabel("rollout success (seed mean, 5-step avg)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "curves.png", dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--recipe", required=True)
    parser.add_argument("--model", required=True, help="the shared cold-start checkpoint")
    parser.add_argument("--out", required=True)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--variant", action="append", required=True, help="name:override;override")
    parser.add_argument("--set", action="append", default=[], dest="common",
                        help="an override for every variant (key=value, repeatable)")
    parser.add_argument("--import", action="append", default=[], dest="imports", metavar="MODULE_OR_FILE.py",
                        help="a plugin to import first (your estimators, losses, environments; repeatable)")
    parser.add_argument("--coupling", help="trajectories_<split>.jsonl to run the coupling lab on")
    parser.add_argument("--coupling-pairs", type=int, default=16)
    args = parser.parse_args()

    out = Path(args.out)
    summary, runs = {}, {}
    for spec in args.variant:
        name, _, overrides = spec.partition(":")
        overrides = [*args.common, *(o for o in overrides.split(";") if o.strip())]
        runs[name] = [out / name / f"seed{seed}" for seed in args.seeds]
        per_seed = [train_once(args.recipe, args.model, overrides, args.imports, seed, d)
                    for seed, d in zip(args.seeds, runs[name])]
        summary[name] = pooled(per_seed)
        print(name, json.dumps({s: round(r["success"], 3) for s, r in summary[name].items()}))
    text = markdown(summary)
    if args.coupling:
        trajectories = read_trajectories(args.coupling)
        coupling = {"cold start": coupling_of(args.model, trajectories, args.coupling_pairs)}
        for name, dirs in runs.items():
            per_seed = [coupling_of(latest_checkpoint(d) / "model", trajectories, args.coupling_pairs) for d in dirs]
            coupling[name] = {k: statistics.fmean(c[k] for c in per_seed) for k in per_seed[0]}
        summary = {"methods": summary, "coupling": coupling}
        text += "\n\nCoupling on " + args.coupling + ":\n\n" + coupling_table(coupling)
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    (out / "summary.md").write_text(text + "\n")
    plot_curves(out, runs)
    print(text)


if __name__ == "__main__":
    try:
        main()
    except ConfigError as err:
        print(err, file=sys.stderr)
        sys.exit(2)
