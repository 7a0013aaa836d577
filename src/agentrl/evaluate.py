"""Evaluation on the L0 / L1 / L2 splits: success with a 95% Wilson interval, per task type."""

from __future__ import annotations

import json
import math
from collections import defaultdict
from pathlib import Path

import torch

from agentrl.errors import RunError
from agentrl.files import write_atomic
from agentrl.progress import set_stage, task
from agentrl.provenance import changes
from agentrl.rollout.collect import collect
from agentrl.rollout.records import write_trajectories


def wilson_interval(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    if n == 0:
        return 0.0, 0.0
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def summarize(trajectories) -> dict:
    """Success over the episodes that finished; aborted ones (a worker failed) are counted apart.
    `mean_return` is the mean over episodes of their summed environment rewards (ScienceWorld: the
    final score, where success, a score of 100, is rare; a failed task -100); `mean_score` the
    same clipped at 0 per episode (`Trajectory.score`: how ScienceWorld's paper averages scores)."""
    aborted = sum(t.aborted for t in trajectories)
    trajectories = [t for t in trajectories if not t.aborted]
    n = len(trajectories)
    wins = sum(t.success for t in trajectories)
    steps = [s for t in trajectories for s in t.steps]
    by_type = defaultdict(list)
    for t in trajectories:
        by_type[t.task_type].append(t.success)
    low, high = wilson_interval(wins, n)
    return {
        "episodes": n, "success": wins / max(n, 1), "ci95": [low, high],
        "per_task_type": {k: sum(v) / len(v) for k, v in sorted(by_type.items())},
        "per_task_type_counts": {k: {"success": sum(v), "episodes": len(v)} for k, v in sorted(by_type.items())},
        "invalid_rate": sum(not s.valid for s in steps) / max(len(steps), 1),
        "repeated_rate": sum(t.repeated_actions for t in trajectories) / max(len(steps), 1),
        "mean_length": len(steps) / max(n, 1),
        "mean_return": sum(s.reward for s in steps) / max(n, 1),
        "mean_score": sum(t.score for t in trajectories) / max(n, 1),
        "aborted": aborted,
        "context_ended": sum(t.context_ended for t in trajectories),
    }


def evaluate(pool, sampler, tokenizer, eval_cfg, prompt, seed: int, out_dir: Path | None = None,
             components=(), settings: dict | None = None) -> dict:
    """Play the first `episodes` tasks of each split once, `batch_size` at a time; sampling RNG
    forked and seeded per split, so the result is reproducible and training's RNG stream is
    untouched. Each of the trainer's `components` adds its own numbers on each split's trajectories
    (a GCD judge: its accuracy). With `out_dir` and `settings` (what the results depend on), each
    finished split is recorded (`<split>.done.json`), and a split an earlier, stopped evaluation
    finished with the same settings is read back, not played again."""
    results = {}
    for split in eval_cfg.splits:
        done = out_dir / f"{split}.done.json" if out_dir is not None and settings is not None else None
        if done is not None and done.is_file() and (out_dir / f"trajectories_{split}.jsonl").is_file():
            record = json.loads(done.read_text())
            if not changes(record["settings"], settings):
                results[split] = record["results"]
                continue
        set_stage(f"evaluation {split}")
        tasks = pool.local.split_tasks(split)[:eval_cfg.episodes]
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            size = eval_cfg.batch_size or max(len(tasks), 1)
            trajectories = []
            with task(f"evaluation {split}", len(tasks)) as advance:
                for start in range(0, len(tasks), size):  # the pool keeps the first batch's environments
                    trajectories += collect(pool, sampler, tokenizer, tasks[start:start + size], 1, prompt,
                                            eval_cfg.sampling, first_group_id=start, finished=advance)
            results[split] = summarize(trajectories)
            finished, aborted = results[split]["episodes"], results[split]["aborted"]
            if not finished or aborted / (finished + aborted) > eval_cfg.max_aborted_share:
                raise RunError(f"evaluation on {split}: {aborted} of {finished + aborted} episodes aborted (more than "
                               f"eval.max_aborted_share = {eval_cfg.max_aborted_share:g}, or none finished): "
                               f"{pool.fault_summary()}")
            for component in components:
                results[split].update(component.evaluate(trajectories, seed))
        if out_dir is not None:
            out_dir.mkdir(parents=True, exist_ok=True)
            write_trajectories(out_dir / f"trajectories_{split}.jsonl", trajectories)
        if done is not None:
            write_atomic(done, json.dumps({"settings": settings, "results": results[split]}))
    if out_dir is not None:
        write_atomic(out_dir / "results.json", json.dumps(results, indent=2))
        for split in eval_cfg.splits:  # the whole evaluation's record is results.json now
            (out_dir / f"{split}.done.json").unlink(missing_ok=True)
    return results
