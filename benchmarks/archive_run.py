"""Keep a finished pipeline run in the repository, without its models: the resolved config, the
phase record, every evaluation's results, the RL metrics, and the trajectories slimmed to what the
comparisons read (each step's action, rewards and appended prompt; observations and responses
dropped). The RL model's final evaluation is kept once, under rl/eval/step_N.

    python benchmarks/archive_run.py runs/alfworld-cpu-full/seed1 benchmarks/results/alfworld-full/full/seed1
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

KEPT = ("config.yaml", "phases.json")
DROPPED_STEP_FIELDS = ("observation", "response")


def slim(src: Path, dst: Path) -> None:
    with src.open() as inp, dst.open("w") as out:
        for line in inp:
            episode = json.loads(line)
            for step in episode.get("steps", []):
                step.update({field: "" for field in DROPPED_STEP_FIELDS if field in step})
            out.write(json.dumps(episode) + "\n")


def is_trajectory(rel: Path) -> bool:
    return rel.name.startswith("trajectories_") and rel.suffix == ".jsonl"


def kept(run: Path, rel: Path) -> bool:
    """Whether the file at `rel` in `run` is archived: records, results and trajectories, no models."""
    name = rel.as_posix()
    if rel.parts[0] in ("model-init", "sft") or "checkpoint" in name:
        return False
    if name in KEPT or rel.name == "results.json" or name == "rl/logs/metrics.jsonl":
        return True
    if is_trajectory(rel):
        # eval/rl plays the same games as the RL run's last evaluation, kept under rl/eval
        return rel.parts[:2] != ("eval", "rl") or not any((run / "rl" / "eval").glob("step_*"))
    return False


def archive(run: Path, dest: Path) -> list[Path]:
    """Copies into `dest`, which appears under its name only when complete."""
    if not (run / "config.yaml").is_file():  # the pipeline writes it when every phase is done
        raise SystemExit(f"{run}: no config.yaml: not a finished pipeline run")
    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    written = []
    for path in sorted(run.rglob("*")):
        rel = path.relative_to(run)
        if not path.is_file() or not kept(run, rel):
            continue
        target = tmp / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        if is_trajectory(rel):
            slim(path, target)
        else:
            shutil.copyfile(path, target)
        written.append(dest / rel)
    tmp.rename(dest)
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path)
    parser.add_argument("dest", type=Path)
    args = parser.parse_args()
    for path in archive(args.run, args.dest):
        print(path)


if __name__ == "__main__":
    main()
