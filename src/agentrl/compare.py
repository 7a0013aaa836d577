"""`agentrl compare`: methods side by side over seeds, with statistics where the run is the unit.

Two ways in:
- train: from one recipe and one starting model, each method (`name:override;override`) trains one
  RL run per seed in `<out>/<name>/seed<k>` (a finished run is reused while its settings and
  starting model are unchanged; a stopped one continues);
- read: run folders a researcher already has, one per seed, grouped by method
  (`--runs OUT` takes `OUT/<method>/<run>/`; `--runs name=DIR[@PHASE]` takes DIR's run folders).
  A run folder is an RL run (`agentrl train`'s `rl/`, or a folder this command trained) or a whole
  pipeline (`agentrl run`'s run_dir: PHASE picks `initial`, `sft` or `rl`, default its last).

Pairing: two methods' runs of the same seed are a pair. A seed fixes the training task draws and the
evaluation's sampling stream, and every run of a recipe evaluates the same first tasks of each split,
so a paired difference compares the methods on the same draws and the same evaluation tasks; what
differs between seeds (the policy trained) is what the intervals range over. See `agentrl.stats`.
"""

from __future__ import annotations

import itertools
import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import yaml

from agentrl import stats
from agentrl.config import ConfigError
from agentrl.files import write_atomic
from agentrl.rollout.records import read_trajectories
from agentrl.tracking import read_metrics

PHASES = ("initial", "sft", "rl")
METRICS = {"success": ("Success (%)", 100.0, lambda t: float(t.success)),
           "return": ("Return (the episode's summed reward; ScienceWorld: its final score)", 1.0,
                      lambda t: t.episode_reward),
           "score": ("Score (the return clipped at 0 per episode: ScienceWorld's score as its paper averages it, "
                     "a failed task's -100 counted 0)", 1.0, lambda t: t.score)}
"""What a run's evaluation is compared on: its label, the factor that puts it in points (success
in percentage points, a return or score in its own units) and each episode's value."""


@dataclass
class Run:
    """One run's final evaluation: per split, each evaluation task's outcome (aborted episodes left out)."""
    path: Path
    seed: int
    outcomes: dict[str, dict[str, float]]
    """split -> task id -> the metric compared (`METRICS`): success 1.0 / 0.0, the episode's return or score"""
    extras: dict[str, dict[str, float]] = field(default_factory=dict)
    """split -> other numbers its evaluation recorded (a GCD judge's accuracy)"""
    metrics: list[dict] = field(default_factory=list)
    """The RL phase's metrics.jsonl rows (curves); empty for the initial and SFT phases."""


# --- reading runs --------------------------------------------------------------------------------
def _seed(config_file: Path) -> int:
    return int(yaml.safe_load(config_file.read_text())["seed"])


def _last_eval(rl_dir: Path) -> Path | None:
    found = sorted(rl_dir.glob("eval/step_*"))
    return found[-1] if found else None


def read_run(path: str | Path, phase: str | None = None, metric: str = "success") -> Run:
    """The final evaluation of a finished run folder, each episode's `metric` (ConfigError: not a
    run, or not finished)."""
    path = Path(path)
    if any((path / "eval" / p).is_dir() for p in PHASES):  # an RL run's eval/ holds step_N folders
        return _read_pipeline(path, phase, metric)
    if phase not in (None, "rl"):
        raise ConfigError(f"{path}: an RL run folder has no {phase} phase (phases belong to `agentrl run` folders)")
    config = path / "config.yaml"
    final = _last_eval(path)
    if not config.is_file() or final is None:
        raise ConfigError(f"{path}: not a run folder (no config.yaml and eval/step_*), or not finished")
    steps = (yaml.safe_load(config.read_text()).get("rl") or {}).get("steps")
    if final.name != f"step_{steps:06d}":
        raise ConfigError(f"{path}: not finished (last evaluation {final.name}, rl.steps = {steps})")
    return _read_eval(path, _seed(config), final, _metrics(path / "logs" / "metrics.jsonl"), metric)


def _read_pipeline(path: Path, phase: str | None, metric: str) -> Run:
    if not (path / "config.yaml").is_file():
        raise ConfigError(f"{path}: the pipeline has not finished (no config.yaml)")
    done = [p for p in PHASES if (path / "eval" / p / "results.json").is_file()]
    phase = phase or (done[-1] if done else "rl")
    if phase not in done:
        raise ConfigError(f"{path}: no evaluation of phase {phase!r} (has: {', '.join(done) or 'none'})")
    if phase != "rl":
        return _read_eval(path, _seed(path / "config.yaml"), path / "eval" / phase, [], metric)
    final = _last_eval(path / "rl")
    if final is None:
        raise ConfigError(f"{path}: the RL phase's evaluation is missing (no rl/eval/step_*)")
    return _read_eval(path, _seed(path / "config.yaml"), final, _metrics(path / "rl" / "logs" / "metrics.jsonl"),
                      metric)


def _metrics(path: Path) -> list[dict]:
    return read_metrics(path) if path.is_file() else []


def _read_eval(path: Path, seed: int, eval_dir: Path, metrics: list[dict], metric: str) -> Run:
    results = json.loads((eval_dir / "results.json").read_text())
    outcomes, extras = {}, {}
    for split, result in results.items():
        trajectories = read_trajectories(eval_dir / f"trajectories_{split}.jsonl")
        outcomes[split] = {t.task_id: METRICS[metric][2](t) for t in trajectories if not t.aborted}
        extras[split] = {k: v for k, v in result.items() if k == "judge_accuracy"}
    return Run(path, seed, outcomes, extras, metrics)


def _is_run(path: Path) -> bool:
    return path.is_dir() and ((path / "phases.json").is_file() or (path / "config.yaml").is_file())


def find_runs(specs: list[str], metric: str = "success") -> dict[str, list[Run]]:
    """Runs per method from `--runs` specs: `DIR` (each subfolder holding run folders is a method) or
    `name=DIR[@PHASE]` (DIR's run folders, or DIR itself when it is one)."""
    methods: dict[str, list[Run]] = {}
    for spec in specs:
        name, sep, rest = spec.partition("=")
        if not sep:
            root = Path(spec)
            found = {d.name: d for d in sorted(root.iterdir()) if d.is_dir() and any(map(_is_run, d.iterdir()))} \
                if root.is_dir() else {}
            if not found:
                raise ConfigError(f"--runs {spec}: no method folders (<method>/<run>/) in {root}")
            groups = [(method, folder, None) for method, folder in found.items()]
        else:
            folder, _, phase = rest.partition("@")
            if phase and phase not in PHASES:
                raise ConfigError(f"--runs {spec}: phase {phase!r} is not one of {', '.join(PHASES)}")
            groups = [(name, Path(folder), phase or None)]
        for method, folder, phase in groups:
            if method in methods:
                raise ConfigError(f"--runs {spec}: method {method!r} named twice")
            folders = [folder] if _is_run(folder) and not any(map(_is_run, folder.iterdir())) else \
                sorted(d for d in folder.iterdir() if _is_run(d)) if folder.is_dir() else []
            if not folders:
                raise ConfigError(f"--runs {spec}: no run folders in {folder}")
            methods[method] = [read_run(d, phase, metric) for d in folders]
    return methods


# --- statistics ----------------------------------------------------------------------------------
def _rates(runs: list[Run], split: str) -> list[float]:
    return [float(np.mean(list(r.outcomes[split].values()))) for r in runs]


def _parts(parts: stats.Components) -> dict:
    return {"total_sd": parts.total_sd, "between_seeds_sd": parts.between_sd, "within_eval_sd": parts.within_sd,
            "episodes": parts.episodes}


def method_summary(runs: list[Run], splits: list[str]) -> dict:
    """Per split: mean over seeds, its bootstrap interval, IQM, per-seed rates and spread."""
    out = {"seeds": [r.seed for r in runs], "runs": [str(r.path) for r in runs]}
    for split in splits:
        rates = _rates(runs, split)
        parts = stats.components(rates, [list(r.outcomes[split].values()) for r in runs])
        out[split] = {"mean": float(np.mean(rates)), "ci95": stats.interval(rates), "iqm": stats.iqm(rates),
                      "per_seed": rates, **_parts(parts)}
        judged = [r.extras[split]["judge_accuracy"] for r in runs if "judge_accuracy" in r.extras.get(split, {})]
        if judged:
            out[split]["judge_accuracy"] = float(np.mean(judged))
    return out


def paired(a: list[Run], b: list[Run], splits: list[str], scale_seeds=(5, 10, 20), point: float = 0.01) -> dict:
    """A - B over the seeds both have, task by task on the evaluation tasks both played (`point`:
    one point of the metric, for the seeds needed to detect 5 points)."""
    by_seed = {r.seed: r for r in b}
    pairs = [(r, by_seed[r.seed]) for r in a if r.seed in by_seed]
    out = {"seeds": [x.seed for x, _ in pairs]}
    if not pairs:
        return out
    for split in splits:
        scores = []  # per seed: the per-task differences
        for x, y in pairs:
            tasks = sorted(set(x.outcomes[split]) & set(y.outcomes[split]))
            if not tasks:
                raise ConfigError(f"{x.path} and {y.path}: no evaluation task of {split} in common")
            scores.append([x.outcomes[split][t] - y.outcomes[split][t] for t in tasks])
        diffs = [float(np.mean(s)) for s in scores]
        parts = stats.components(diffs, scores)
        xs, ys = _rates([x for x, _ in pairs], split), _rates([y for _, y in pairs], split)
        mean = float(np.mean(diffs))

        def sized(mdd: float) -> float | None:  # no spread measured (every seed's difference equal): unknown, not 0
            return mdd if parts.total_sd > 0 else None

        out[split] = {
            "difference": mean, "ci95": stats.interval(diffs), "per_seed": diffs,
            "t_ci95": stats.t_interval(diffs), "t_p": stats.t_pvalue(diffs),
            "p_improvement": stats.probability_of_improvement(xs, ys),
            "p_improvement_ci95": stats.improvement_interval(xs, ys),
            "seeds_a_better": sum(d > 0 for d in diffs), "seeds_tied": sum(d == 0 for d in diffs),
            "mdd": sized(stats.detectable_difference(parts, len(diffs))), **_parts(parts),
            "mdd_at_seeds": {str(n): sized(stats.detectable_difference(parts, n)) for n in scale_seeds},
            "mdd_at_4x_episodes": sized(stats.detectable_difference(parts, len(diffs), 4 * parts.episodes)),
            "seeds_to_detect": {"observed": stats.seeds_needed(parts, abs(mean)),
                                "5 points": stats.seeds_needed(parts, 5 * point)},
        }
    return out


def summarize(methods: dict[str, list[Run]], metric: str = "success") -> dict:
    """Every method's summary and every pair's paired differences, on the splits all runs share."""
    splits = [s for s in next(iter(methods.values()))[0].outcomes
              if all(s in r.outcomes for runs in methods.values() for r in runs)]
    point = 1 / METRICS[metric][1]
    return {"confidence": stats.CONFIDENCE, "power": stats.POWER, "metric": metric, "splits": splits,
            "methods": {name: method_summary(runs, splits) for name, runs in methods.items()},
            "pairs": {f"{a} - {b}": paired(methods[a], methods[b], splits, point=point)
                      for a, b in itertools.combinations(methods, 2)}}


# --- report --------------------------------------------------------------------------------------
def markdown(summary: dict) -> str:
    label, scale, _ = METRICS[summary.get("metric", "success")]

    def _pts(value: float | None) -> str:
        return "-" if value is None else "inf" if value == float("inf") else f"{value * scale:.1f}"

    splits = summary["splits"]
    head = "| method | seeds | " + " | ".join(f"{s.upper()} mean [95% CI] (IQM)" for s in splits) + " |"
    lines = [f"{label}: mean over seeds, 95% percentile-bootstrap interval over seeds, interquartile mean.",
             "", head, "|---" * (len(splits) + 2) + "|"]
    for name, m in summary["methods"].items():
        cells = [f"{_pts(m[s]['mean'])} [{_pts(m[s]['ci95'][0])}, {_pts(m[s]['ci95'][1])}] ({_pts(m[s]['iqm'])})"
                 + (f", judge {m[s]['judge_accuracy'] * 100:.1f}" if "judge_accuracy" in m[s] else "") for s in splits]
        lines.append(f"| {name} | {len(m['seeds'])} | " + " | ".join(cells) + " |")
    lines += ["", "Per seed, and the spread between seeds (training) and within a seed (evaluation), sd in points:",
              "", "| method | seeds | " + " | ".join(f"{s.upper()} per seed | sd seeds / eval" for s in splits) + " |",
              "|---" * (2 * len(splits) + 2) + "|"]
    for name, m in summary["methods"].items():
        cells = [f"{' / '.join(f'{v * scale:.{0 if scale == 100 else 1}f}' for v in m[s]['per_seed'])} | "
                 f"{_pts(m[s]['between_seeds_sd'])} / "
                 f"{_pts(m[s]['within_eval_sd'])}" for s in splits]
        lines.append(f"| {name} | {', '.join(map(str, m['seeds']))} | " + " | ".join(cells) + " |")
    lines += ["", "Paired differences (points; same seeds, same evaluation tasks). P(A>B): probability of "
              "improvement with its 95% interval; MDD: the smallest difference these seeds detect with 80% power "
              "(two-sided 5% paired t-test), and at more seeds or 4x the evaluation episodes.", "",
              "| A - B | split | seeds | difference [95% CI] | t-interval [95%], p | P(A>B) | A better | "
              "sd: seeds / eval | MDD | MDD at 5 / 10 / 20 seeds | MDD at 4x episodes | seeds to detect observed / 5 pts |",
              "|---" * 12 + "|"]
    for pair, p in summary["pairs"].items():
        for s in splits:
            if s not in p:
                continue
            r = p[s]
            at = " / ".join(_pts(v) for v in r["mdd_at_seeds"].values())
            need = " / ".join(str(v) if v is not None else "-" for v in r["seeds_to_detect"].values())
            excl = " *" if len(p["seeds"]) > 1 and (r["ci95"][0] > 0 or r["ci95"][1] < 0) else ""
            t_excl = " *" if len(p["seeds"]) > 1 and (r["t_ci95"][0] > 0 or r["t_ci95"][1] < 0) else ""
            t_p = "-" if r["t_p"] is None else f"{r['t_p']:.3f}"
            lines.append(f"| {pair} | {s.upper()} | {len(p['seeds'])} | {_pts(r['difference'])} "
                         f"[{_pts(r['ci95'][0])}, {_pts(r['ci95'][1])}]{excl} | [{_pts(r['t_ci95'][0])}, "
                         f"{_pts(r['t_ci95'][1])}]{t_excl}, {t_p} | {r['p_improvement']:.2f} "
                         f"[{r['p_improvement_ci95'][0]:.2f}, {r['p_improvement_ci95'][1]:.2f}] | "
                         f"{r['seeds_a_better']}/{len(p['seeds'])} | {_pts(r['between_seeds_sd'])} / "
                         f"{_pts(r['within_eval_sd'])} | {_pts(r['mdd'])} | {at} | {_pts(r['mdd_at_4x_episodes'])} "
                         f"| {need} |")
    lines += ["", "`*`: the interval excludes 0 (two seeds or more). The difference's interval is the percentile "
              "bootstrap over seeds; the t-interval (paired t-test, p its two-sided p-value) is wider at few seeds, "
              "where the bootstrap covers less than 95%: report an ordering when both exclude 0. MDD `-`: no spread "
              "was measured to size it by (one seed, or every seed gave the same difference). sd: the spread of the "
              "paired difference from training (between seeds) and from evaluating on finitely many episodes "
              "(within a seed)."]
    return "\n".join(lines) + "\n"


def plot_curves(methods: dict[str, list[Run]], path: Path) -> Path | None:
    """Mean over seeds with a 95% bootstrap band: rollout success, and evaluation success per split
    where the runs evaluated along the way."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    keys = ["rollout/success"] + sorted({k for runs in methods.values() for r in runs for row in r.metrics
                                         for k in row if k.startswith("eval/") and k.count("/") == 2
                                         and k.endswith("/success")})
    keys = [k for k in keys if any(sum(k in row for row in r.metrics) > 1 for runs in methods.values() for r in runs)]
    if not keys:
        return None
    fig, axes = plt.subplots(1, len(keys), figsize=(5 * len(keys), 3.8), squeeze=False)
    for ax, key in zip(axes[0], keys):
        for name, runs in methods.items():
            series = [{row["step"]: row[key] for row in r.metrics if key in row} for r in runs]
            steps = sorted(set.intersection(*(set(s) for s in series)))
            if len(steps) < 2:
                continue
            curves = np.array([[s[step] for step in steps] for s in series])  # (seeds, steps)
            low, high = stats.band(curves)
            line, = ax.plot(steps, curves.mean(axis=0), label=f"{name} ({len(runs)} seeds)")
            ax.fill_between(steps, low, high, color=line.get_color(), alpha=0.2)
        ax.set(title=key, xlabel="RL step", ylim=(-0.02, 1.02))
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_report(methods: dict[str, list[Run]], out: Path, extra: dict | None = None, extra_md: str = "",
                 metric: str = "success") -> dict:
    """summary.json, summary.md and curves.png in `out` (`extra`: more sections of the JSON, with
    their Markdown); returns the summary."""
    for name, runs in methods.items():
        seeds = [r.seed for r in runs]
        if len(set(seeds)) != len(seeds):
            raise ConfigError(f"method {name}: two runs of the same seed ({', '.join(str(r.path) for r in runs)})")
    summary = {**summarize(methods, metric), **(extra or {})}
    out.mkdir(parents=True, exist_ok=True)
    write_atomic(out / "summary.json", json.dumps(summary, indent=2))
    write_atomic(out / "summary.md", markdown(summary) + ("\n" + extra_md if extra_md else ""))
    plot_curves(methods, out / "curves.png")
    return summary


def coupling(model: str, methods: dict[str, list[Run]], trajectories_file: str, pairs: int) -> dict[str, dict]:
    """The coupling lab's numbers on fixed steps (gradient cosine of good vs bad steps, influence
    gap, representation separation) for the starting model and each method's final models (mean
    over seeds)."""
    from agentrl.analysis.coupling import coupling_metrics
    from agentrl.checkpoint import latest_checkpoint
    from agentrl.models import load_model, load_tokenizer

    trajectories = read_trajectories(trajectories_file)

    def measure(path) -> dict[str, float]:
        return coupling_metrics(load_model(str(path)), load_tokenizer(str(path)), trajectories, pairs, 1e-3, seed=0)

    out = {"start": measure(model)}
    for name, runs in methods.items():
        per_seed = [measure(latest_checkpoint(r.path) / "model") for r in runs]
        out[name] = {k: float(np.mean([c[k] for c in per_seed])) for k in per_seed[0]}
    return out


def coupling_markdown(values: dict[str, dict], source: str) -> str:
    keys = ["grad_cos_pos_neg", "influence_gap", "separation"]
    lines = [f"Coupling on {source} (mean over seeds):", "", "| model | " + " | ".join(keys) + " |",
             "|---" * (len(keys) + 1) + "|"]
    lines += [f"| {name} | " + " | ".join(f"{v[k]:.4g}" for k in keys) + " |" for name, v in values.items()]
    return "\n".join(lines) + "\n"


# --- training ------------------------------------------------------------------------------------
def train_once(recipe: str, model: str, overrides: list[str], imports: list[str], seed: int, run_dir: Path,
               metric: str = "success") -> Run:
    """One method's RL run at one seed in `run_dir`: reused when finished with the same settings and
    starting model, continued when stopped with them, otherwise started over."""
    from agentrl.pipeline import rl_settings, train_rl
    from agentrl.provenance import Phases, config_settings, folder_fingerprint
    from agentrl.recipe import load_config, save_config

    config = load_config(recipe, [*overrides, f"seed={seed}", f"run_dir={run_dir}"], imports)
    settings = {**rl_settings(config), **config_settings(config, "rl.steps", "eval"), "model.path": model,
                "model.fingerprint": folder_fingerprint(model)}
    phases = Phases(run_dir, say=lambda line: print(f"{run_dir}: {line}"))
    if not phases.reusable("run", settings, (run_dir / "config.yaml").is_file()):
        if not phases.same("started", settings):  # a stopped run resumes only with the same settings
            for path in (run_dir / "checkpoints", run_dir / "logs", run_dir / "eval", run_dir / "config.yaml"):
                shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)
            phases.complete("started", settings)
        train_rl(config, model, run_dir, resume=True)
        save_config(config, run_dir / "config.yaml")  # last: marks the run finished
        phases.complete("run", settings)
    return read_run(run_dir, metric=metric)


def train_methods(recipe: str, model: str, specs: list[str], seeds: list[int], out: Path, common: list[str],
                  imports: list[str], metric: str = "success") -> dict[str, list[Run]]:
    """Every method (`name:override;override`) at every seed, one after another."""
    methods = {}
    for spec in specs:
        name, sep, overrides = spec.partition(":")
        if not sep or not name or "/" in name:
            raise ConfigError(f"--method {spec!r}: expected name:override;override (overrides may be empty)")
        if name in methods:
            raise ConfigError(f"--method {spec!r}: method {name!r} named twice")
        overrides = [*common, *(o for o in overrides.split(";") if o.strip())]
        methods[name] = [train_once(recipe, model, overrides, imports, seed, out / name / f"seed{seed}", metric)
                         for seed in seeds]
    return methods
