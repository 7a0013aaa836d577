"""`agentrl plot RUN_DIR`: PNG figures of a run from its metrics.jsonl files.

One figure per panel, and all panels in `overview.png`: evaluation success per split with its
95% interval over the steps (step 0: the model RL started from), rollout success and episode
reward, KL and entropy, the sampler-trainer gap, seconds per step broken down, and the SFT loss
when the run has an SFT phase. Needs matplotlib (`pip install 'agentrl[plot]'`).
"""

from __future__ import annotations

from pathlib import Path

from agentrl.config import ConfigError
from agentrl.tracking import read_metrics

TIMING_PARTS = ("gen", "env", "actor_logprobs", "ref", "advantage", "update")
"""The parts of timing_s/step drawn (the rest, components and bookkeeping, is "other")."""


def _series(rows: list[dict], key: str) -> tuple[list[int], list[float]]:
    points = [(r["step"], r[key]) for r in rows if key in r]
    return [s for s, _ in points], [v for _, v in points]


def _eval_success(ax, rows):
    splits = sorted({k.split("/")[1] for r in rows for k in r if k.startswith("eval/") and k.endswith("/success")})
    for split in splits:
        steps, values = _series(rows, f"eval/{split}/success")
        line, = ax.plot(steps, values, marker="o", label=split.upper())
        _, low = _series(rows, f"eval/{split}/ci95_low")
        _, high = _series(rows, f"eval/{split}/ci95_high")
        if len(low) == len(steps):
            ax.fill_between(steps, low, high, color=line.get_color(), alpha=0.15)
    ax.set(title="evaluation success (95% interval)", xlabel="RL step", ylim=(-0.02, 1.02))


def _rollout(ax, rows):
    ax.plot(*_series(rows, "rollout/success"), label="success")
    ax.set(title="training rollouts", xlabel="RL step", ylabel="success")
    twin = ax.twinx()
    twin.plot(*_series(rows, "rollout/episode_reward"), color="tab:orange", linestyle="--", alpha=0.7,
              label="episode reward")
    twin.set_ylabel("episode reward")
    twin.legend(loc="lower right", fontsize=8)


def _kl_entropy(ax, rows):
    ax.plot(*_series(rows, "actor/entropy"), label="entropy")
    ax.set(title="entropy and KL", xlabel="RL step", ylabel="entropy (nats / token)")
    if any("actor/kl" in r for r in rows):
        twin = ax.twinx()
        twin.plot(*_series(rows, "actor/kl"), color="tab:red", label="KL to reference")
        twin.set_ylabel("KL to reference")
        twin.legend(loc="lower right", fontsize=8)


def _sampler_gap(ax, rows):
    for key, label in (("rollout/logprob_diff_mean", "mean |log p diff|"), ("rollout/logprob_diff_max", "max |log p diff|"),
                       ("rollout/kl_sampler_actor", "KL(sampler || actor)")):
        ax.plot(*_series(rows, key), label=label)
    ax.set(title="sampler vs actor log-probs", xlabel="RL step")
    ax.set_yscale("symlog", linthresh=1e-6)


def _step_time(ax, rows):
    rows = [r for r in rows if "timing_s/step" in r]
    steps = [r["step"] for r in rows]
    bottom = [0.0] * len(rows)
    for part in TIMING_PARTS:
        values = [r.get(f"timing_s/{part}", 0.0) for r in rows]
        if any(values):
            ax.bar(steps, values, bottom=bottom, label=part, width=1.0)
            bottom = [b + v for b, v in zip(bottom, values)]
    ax.bar(steps, [r["timing_s/step"] - b for r, b in zip(rows, bottom)], bottom=bottom, label="other", width=1.0)
    ax.set(title="seconds per RL step", xlabel="RL step", ylabel="s",
           ylim=(0, 1.5 * max((r["timing_s/step"] for r in rows), default=1.0)))  # room for the legend


def _sft_loss(ax, rows):
    ax.plot(*_series(rows, "sft/loss"), label="loss")
    ax.set(title="SFT loss", xlabel="SFT step", ylabel="loss")


PANELS = {"eval_success": _eval_success, "rollout": _rollout, "kl_entropy": _kl_entropy,
          "sampler_gap": _sampler_gap, "step_time": _step_time}


def plot_run(run_dir: str | Path, out_dir: str | Path | None = None) -> list[Path]:
    """Write the figures of `run_dir` (a pipeline's run folder or its rl/ folder) into `out_dir`
    (default RUN_DIR/plots); returns their paths."""
    try:
        import matplotlib
    except ImportError:
        raise ConfigError("agentrl plot needs matplotlib: pip install 'agentrl[plot]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    run_dir = Path(run_dir)
    rl_metrics = next((p for p in (run_dir / "rl" / "logs" / "metrics.jsonl", run_dir / "logs" / "metrics.jsonl")
                       if p.is_file() and any(k.startswith("rollout/") for r in read_metrics(p) for k in r)), None)
    if rl_metrics is None:
        raise ConfigError(f"{run_dir}: no RL metrics (rl/logs/metrics.jsonl) to plot")
    rows = read_metrics(rl_metrics)
    panels = [(name, draw, rows) for name, draw in PANELS.items()]
    sft_metrics = run_dir / "sft" / "logs" / "metrics.jsonl"
    if sft_metrics.is_file():
        panels.append(("sft_loss", _sft_loss, read_metrics(sft_metrics)))
    out_dir = Path(out_dir) if out_dir is not None else run_dir / "plots"
    out_dir.mkdir(parents=True, exist_ok=True)

    written = []
    for name, draw, data in panels:
        fig, ax = plt.subplots(figsize=(6, 4))
        draw(ax, data)
        ax.legend(loc="upper left", fontsize=8)
        fig.tight_layout()
        fig.savefig(out_dir / f"{name}.png", dpi=110)
        plt.close(fig)
        written.append(out_dir / f"{name}.png")
    columns = 3
    fig, axes = plt.subplots(-(-len(panels) // columns), columns, figsize=(6 * columns, 4 * -(-len(panels) // columns)),
                             squeeze=False)
    for ax, (name, draw, data) in zip(axes.flat, panels):
        draw(ax, data)
        ax.legend(loc="upper left", fontsize=8)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    fig.suptitle(f"{run_dir}")
    fig.tight_layout()
    fig.savefig(out_dir / "overview.png", dpi=90)
    plt.close(fig)
    return [*written, out_dir / "overview.png"]
