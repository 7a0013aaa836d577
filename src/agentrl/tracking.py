"""Metrics: TensorBoard scalars and text plus a `metrics.jsonl` line per step, both resumable."""

from __future__ import annotations

import json
from pathlib import Path

from torch.utils.tensorboard import SummaryWriter

from agentrl.files import write_atomic


class Tracker:
    def __init__(self, log_dir: Path, resume_step: int = 0):
        log_dir.mkdir(parents=True, exist_ok=True)
        self.jsonl = log_dir / "metrics.jsonl"
        if self.jsonl.exists():
            # Drop lines logged after the checkpoint we resume from (all of them when starting
            # over): they will be logged again. A line cut by a kill is dropped too.
            kept = [ln for ln in self.jsonl.read_text().splitlines() if (step := _step(ln)) is not None
                    and step <= resume_step]
            write_atomic(self.jsonl, "".join(ln + "\n" for ln in kept))
        self.writer = SummaryWriter(str(log_dir / "tb"), purge_step=resume_step + 1)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        for key, value in metrics.items():
            self.writer.add_scalar(key, value, step)
        with self.jsonl.open("a") as f:
            f.write(json.dumps({"step": step, **metrics}) + "\n")
        self.writer.flush()

    def text(self, tag: str, markdown: str, step: int) -> None:
        """A text panel (TensorBoard renders markdown): sampled generations, the resolved config."""
        self.writer.add_text(tag, markdown, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


def _step(line: str) -> int | None:
    try:
        return int(json.loads(line)["step"])
    except (ValueError, KeyError, TypeError):
        return None


def read_metrics(path: Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
