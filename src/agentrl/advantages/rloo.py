"""RLOO: each episode's reward minus the mean reward of the other K-1 episodes of its group.

Every step gets its episode's advantage, minus the step's invalid-action penalty.
"""

from __future__ import annotations

from typing import Literal

from agentrl.advantages.common import Advantages, register
from agentrl.config import Section
from agentrl.rollout.types import group_by_id


class RLOOConfig(Section):
    """RLOO: the episode return minus the mean of the group's other episodes."""

    type: Literal["rloo"] = "rloo"
    """Estimator name in the registry."""


@register("rloo", RLOOConfig)
def rloo(trajectories, config) -> Advantages:
    values: dict[int, list[float]] = {}
    for group in group_by_id(trajectories).values():
        total, k = sum(t.episode_reward for t in group), len(group)
        for t in group:
            advantage = t.episode_reward - (total - t.episode_reward) / (k - 1) if k > 1 else 0.0
            values[id(t)] = [advantage - s.penalty for s in t.steps]
    return Advantages([values[id(t)] for t in trajectories])
