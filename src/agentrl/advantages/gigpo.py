"""GiGPO (arXiv 2505.10978): episode-level GRPO plus step-level credit from anchor states.

A_t = A_episode + w * A_step. A_episode normalises the episode reward over the K episodes of
the task group. A_step normalises the step's discounted return R_t = r_t + gamma * R_{t+1}
(invalid penalty subtracted after discounting) within its anchor group: all steps of the task
group whose raw observation is identical. A singleton anchor group gives A_step = 0.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from agentrl.advantages.common import (
    Advantages,
    anchor_groups,
    anchor_size_metrics,
    discounted_returns,
    normalize,
    register,
    sample_std,
)
from agentrl.config import Section
from agentrl.rollout.types import group_by_id


class GiGPOConfig(Section):
    """GiGPO: the episode advantage plus a step advantage from anchor states (identical states across
    the group's rollouts, their discounted returns normalised within each anchor group)."""

    type: Literal["gigpo"] = "gigpo"
    """Estimator name in the registry."""
    gamma: float = Field(0.95, ge=0, le=1)
    """Discount of the step returns."""
    step_weight: float = 1.0
    """w in A = A_episode + w * A_step."""
    step_std: bool = True
    """Anchor-group normalisation: mean-std (True) or mean-only (False)."""
    episode_std: bool = True
    """Episode-level normalisation: mean-std (True) or mean-only (False)."""
    eps: float = Field(1e-6, ge=0)
    """Added to the std before dividing."""


@register("gigpo", GiGPOConfig)
def gigpo(trajectories, config) -> Advantages:
    values: dict[int, list[float]] = {}
    sizes: list[int] = []
    for group in group_by_id(trajectories).values():
        episode_rewards = [t.episode_reward for t in group]
        returns = {id(t): [r - s.penalty for r, s in zip(discounted_returns([s.reward for s in t.steps],
                                                                             config.gamma), t.steps)]
                   for t in group}
        anchors = anchor_groups(group, returns)
        sizes += [len(v) for v in anchors.values()]
        for t in group:
            [episode] = normalize([t.episode_reward], episode_rewards, sample_std(config.episode_std), config.eps)
            values[id(t)] = [
                episode + config.step_weight * normalize([r], anchors[s.anchor], sample_std(config.step_std),
                                                         config.eps)[0]
                for s, r in zip(t.steps, returns[id(t)])]
    return Advantages([values[id(t)] for t in trajectories], anchor_size_metrics(sizes))
