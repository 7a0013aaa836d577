"""GAGPO (Zhu et al. 2026, "Generalized Advantage Grouped Policy Optimization", arXiv 2605.13217,
section 3): critic-free GAE over environment steps.

V(s) is the mean discounted return over the state group G(s) (the GiGPO anchor groups of the
task group). delta_t = r_t + gamma * V(s_{t+1}) - V(s_t) with V = 0 after the last step, and
A_t = delta_t + gamma * lambda * A_{t+1}. The invalid penalty is subtracted from A_t after the
recursion, then A is normalised over all steps of the rollout group. No episode-level term.
Pair with the `seq_ratio` policy loss (sequence-level ratio per action), as in the paper.
"""

from __future__ import annotations

import statistics
from typing import Literal

from pydantic import Field

from agentrl.advantages.common import (
    Advantages,
    anchor_groups,
    anchor_size_metrics,
    discounted_returns,
    gae,
    normalize,
    register,
    sample_std,
)
from agentrl.config import Section
from agentrl.rollout.types import group_by_id


class GAGPOConfig(Section):
    """GAGPO: a grouped value proxy per anchor state and GAE over steps (use with `loss.type:
    seq_ratio`)."""

    type: Literal["gagpo"] = "gagpo"
    """Estimator name in the registry."""
    gamma: float = Field(0.95, ge=0, le=1)
    """Discount of rewards over steps (the paper: 0.95; 1.0 degrades)."""
    lam: float = Field(0.8, ge=0, le=1)
    """GAE lambda (the paper's best: 0.8)."""
    normalize_std: bool = True
    """Divide by the rollout group's std after centring."""
    eps: float = Field(1e-6, ge=0)
    """Added to the std before dividing."""


@register("gagpo", GAGPOConfig)
def gagpo(trajectories, config) -> Advantages:
    values: dict[int, list[float]] = {}
    sizes: list[int] = []
    for group in group_by_id(trajectories).values():
        returns = {id(t): discounted_returns([s.reward for s in t.steps], config.gamma) for t in group}
        anchors = anchor_groups(group, returns)
        sizes += [len(v) for v in anchors.values()]
        value_of = {anchor: statistics.fmean(v) for anchor, v in anchors.items()}
        raw: dict[int, list[float]] = {}
        for t in group:
            out = gae([s.reward for s in t.steps], [value_of[s.anchor] for s in t.steps], config.gamma, config.lam)
            raw[id(t)] = [a - s.penalty for a, s in zip(out, t.steps)]
        pool = [a for t in group for a in raw[id(t)]]
        for t in group:
            values[id(t)] = normalize(raw[id(t)], pool, sample_std(config.normalize_std), config.eps)
    return Advantages([values[id(t)] for t in trajectories], anchor_size_metrics(sizes))
