"""GAGPO (seeds/gagpo.txt, section 3): critic-free GAE over environment steps.

V(s) is the mean discounted return over the state group G(s) (the GiGPO anchor groups of the
task group). delta_t = r_t + gamma * V(s_{t+1}) - V(s_t) with V = 0 after the last step, and
A_t = delta_t + gamma * lambda * A_{t+1}. The invalid penalty is subtracted from A_t after the
recursion, then A is normalised over all steps of the rollout group. No episode-level term.
Pair with the `seq_ratio` policy loss (sequence-level ratio per action), as in the paper.
"""

from __future__ import annotations

import statistics

from agentrl.advantages.common import (Advantages, anchor_groups, anchor_size_metrics, discounted_returns, gae, normalize,
                                       register, sample_std)
from agentrl.config import GAGPOConfig
from agentrl.rollout.types import group_by_id


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
