"""Shared pieces of the estimators: their result (`Advantages`), registration, discounted
returns, GAE, anchor-state groups, group normalisation."""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import dataclass, field

from agentrl.registry import ADVANTAGES


@dataclass
class Advantages:
    values: list[list[float]]
    """values[i][t]: advantage of step t of trajectory i (same order as the input)."""
    metrics: dict[str, float] = field(default_factory=dict)
    returns: list[list[float]] | None = None
    """returns[i][t]: the critic's regression target for that step (estimators with a critic)."""


register = ADVANTAGES.register


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


def normalize(values: list[float], pool: list[float], std: str | None, eps: float) -> list[float]:
    """Group normalisation, for every estimator and the GCD judge: (x - mean) / (std + eps) of
    each x in `values`, with the mean and std of `pool`; only centred when `std` is None; all 0
    when the pool has fewer than two values or no spread to divide by.

    `std="sample"` is the unbiased estimate (torch.std, as in verl): an estimator's group is a
    sample of the policy's outcomes on its task. `std="population"` divides by n instead of n - 1:
    GCD's judgments of one pair, whose group is taken as the whole population."""
    if len(pool) < 2:
        return [0.0] * len(values)
    mean = statistics.fmean(pool)
    if std is None:
        return [x - mean for x in values]
    scale = {"sample": statistics.stdev, "population": statistics.pstdev}[std](pool) + eps
    if scale == 0:  # no spread and eps 0
        return [0.0] * len(values)
    return [(x - mean) / scale for x in values]


def sample_std(flag: bool) -> str | None:
    """An estimator's `*_std` switch as `normalize`'s std: the sample std, or none."""
    return "sample" if flag else None


def anchor_size_metrics(sizes: list[int]) -> dict[str, float]:
    """The anchor-group size distribution: share of singleton groups and mean size."""
    if not sizes:
        return {}
    return {"anchor_singleton_share": sum(n == 1 for n in sizes) / len(sizes),
            "anchor_mean_size": sum(sizes) / len(sizes)}
