"""Shared pieces of the step-level estimators: discounted returns, GAE, anchor-state groups."""

from __future__ import annotations

import statistics
from collections import defaultdict


def discounted_returns(rewards: list[float], gamma: float) -> list[float]:
    """R_t = r_t + gamma * R_{t+1}, R_T = 0."""
    out, running = [0.0] * len(rewards), 0.0
    for t in reversed(range(len(rewards))):
        running = rewards[t] + gamma * running
        out[t] = running
    return out


def gae(rewards: list[float], values: list[float], gamma: float, lam: float) -> list[float]:
    """A_t = delta_t + gamma * lam * A_{t+1}, delta_t = r_t + gamma * V_{t+1} - V_t, V after the
    last step 0 (`values` has one entry per step)."""
    v = list(values) + [0.0]
    out, running = [0.0] * len(rewards), 0.0
    for t in reversed(range(len(rewards))):
        running = rewards[t] + gamma * v[t + 1] - v[t] + gamma * lam * running
        out[t] = running
    return out


def anchor_groups(group, values: dict[int, list[float]]) -> dict[str, list[float]]:
    """Values of every step of one task group, keyed by the step's anchor (identical state)."""
    groups: dict[str, list[float]] = defaultdict(list)
    for traj in group:
        for step, value in zip(traj.steps, values[id(traj)]):
            groups[step.anchor].append(value)
    return groups


def normalize(value: float, pool: list[float], use_std: bool, eps: float) -> float:
    """(value - mean) [/ (std + eps)] over pool; 0 for a pool of one."""
    if len(pool) < 2:
        return 0.0
    centred = value - statistics.fmean(pool)
    return centred / (statistics.stdev(pool) + eps) if use_std else centred


def anchor_size_metrics(sizes: list[int]) -> dict[str, float]:
    """The anchor-group size distribution: share of singleton groups and mean size."""
    if not sizes:
        return {}
    return {"anchor_singleton_share": sum(n == 1 for n in sizes) / len(sizes),
            "anchor_mean_size": sum(sizes) / len(sizes)}
