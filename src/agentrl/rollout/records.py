"""Trajectories as JSON lines: evaluation's `trajectories_<split>.jsonl` and training's
`rl/rollouts/step_N.jsonl.gz` share one record, one line per episode, so the analysis commands
and a researcher's own scripts read both.

    {"task_id", "task_type", "group_id", "success", "aborted", "version" (training, where recorded),
     "context_ended" (where true),
     "steps": [{"observation", "prompt", "response", "action", "reward", "penalty", "progress",
                "anchor", "advantage", "rejected"}, ...]}

Text only (no token ids); a path ending in .gz is gzip-compressed.
"""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

from agentrl.rollout.types import StepSample, Trajectory

STEP_FIELDS = ("observation", "prompt", "response", "action", "reward", "penalty", "progress", "anchor", "advantage",
               "rejected")


def to_record(t: Trajectory) -> dict:
    version = {} if t.version is None else {"version": t.version}
    ended = {"context_ended": True} if t.context_ended else {}
    return {"task_id": t.task_id, "task_type": t.task_type, "group_id": t.group_id, "success": t.success,
            "aborted": t.aborted, **version, **ended,
            "steps": [{k: getattr(s, k) for k in STEP_FIELDS} for s in t.steps]}


def from_record(row: dict) -> Trajectory:
    steps = [StepSample([], [], [], response=s["response"], action=s["action"], observation=s["observation"],
                        anchor=s.get("anchor") or s["observation"], reward=s["reward"], penalty=s.get("penalty", 0.0),
                        prompt=s.get("prompt", ""), progress=s.get("progress"), advantage=s.get("advantage"),
                        rejected=s.get("rejected", 0))
             for s in row["steps"]]
    return Trajectory(row["task_id"], row.get("group_id", 0), row["task_type"], steps, success=row["success"],
                      aborted=row.get("aborted", False), version=row.get("version"),
                      context_ended=row.get("context_ended", False))


def _open(path: Path, mode: str, compressed: bool):
    return gzip.open(path, mode + "t", encoding="utf-8") if compressed else path.open(mode, encoding="utf-8")


def write_trajectories(path: str | Path, trajectories: list[Trajectory]) -> None:
    """All of `trajectories` to `path`, which appears only when complete."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with _open(tmp, "w", path.suffix == ".gz") as f:
        for t in trajectories:
            f.write(json.dumps(to_record(t)) + "\n")
    os.replace(tmp, path)


def read_trajectories(path: str | Path) -> list[Trajectory]:
    """The trajectories of an evaluation's or a training step's records (ValueError: not records)."""
    path = Path(path)
    out = []
    with _open(path, "r", path.suffix == ".gz") as f:
        for number, line in enumerate(f, 1):
            try:
                out.append(from_record(json.loads(line)))
            except (json.JSONDecodeError, KeyError, TypeError):
                raise ValueError(f"{path}:{number}: not a trajectory record (see `agentrl eval` output)") from None
    return out
