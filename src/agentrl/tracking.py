"""Metrics: a `metrics.jsonl` line per step, TensorBoard scalars and text, and optionally Weights
& Biases (`tracking: [tensorboard, wandb]`); resumable."""

from __future__ import annotations

import html
import json
import uuid
from pathlib import Path

from agentrl.files import write_atomic


class Tracker:
    def __init__(self, log_dir: Path, resume_step: int = 0, config=None, name: str = ""):
        """`config`: the run's Config, logged as text when starting fresh; its `tracking` picks
        the backends (TensorBoard only without one). `name`: the phase ("rl", "sft")."""
        log_dir.mkdir(parents=True, exist_ok=True)
        self.jsonl = log_dir / "metrics.jsonl"
        if self.jsonl.exists():
            # Drop lines logged after the checkpoint we resume from (all of them when starting
            # over): they will be logged again. A line cut by a kill is dropped too.
            kept = [ln for ln in self.jsonl.read_text().splitlines() if (step := _step(ln)) is not None
                    and step <= resume_step]
            write_atomic(self.jsonl, "".join(ln + "\n" for ln in kept))
        backends = config.tracking if config is not None else ["tensorboard"]
        self.writer = self.wandb = None
        if "tensorboard" in backends:
            from torch.utils.tensorboard import SummaryWriter
            self.writer = SummaryWriter(str(log_dir / "tb"), purge_step=resume_step + 1)
        if "wandb" in backends:
            import wandb
            # A resumed phase continues its W&B run (the id is kept beside the logs); a fresh
            # start is a new run.
            id_file = log_dir / "wandb-run-id"
            if resume_step == 0 or not id_file.exists():
                write_atomic(id_file, uuid.uuid4().hex[:12])
            self.wandb = wandb.init(dir=str(log_dir), group=str(config.run_dir), job_type=name or None,
                                    name=f"{Path(config.run_dir).name}/{name}" if name else None,
                                    id=id_file.read_text(), resume="allow",
                                    config=config.model_dump(mode="json"), reinit="create_new")
        if config is not None and resume_step == 0:
            from agentrl.recipe import config_yaml
            self.text("config", f"```yaml\n{config_yaml(config)}```", 0)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        if self.writer is not None:
            for key, value in metrics.items():
                self.writer.add_scalar(key, value, step)
            self.writer.flush()
        if self.wandb is not None:
            self.wandb.log(metrics, step=step)
        with self.jsonl.open("a") as f:
            f.write(json.dumps({"step": step, **metrics}) + "\n")

    def text(self, tag: str, markdown: str, step: int) -> None:
        """A text panel (TensorBoard renders markdown): sampled generations, the resolved config."""
        if self.writer is not None:
            self.writer.add_text(tag, markdown, step)
            self.writer.flush()
        if self.wandb is not None:
            import wandb
            self.wandb.log({tag: wandb.Html(f"<pre>{html.escape(markdown)}</pre>")}, step=step)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        if self.wandb is not None:
            self.wandb.finish()


def _step(line: str) -> int | None:
    try:
        return int(json.loads(line)["step"])
    except (ValueError, KeyError, TypeError):
        return None


def read_metrics(path: Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
