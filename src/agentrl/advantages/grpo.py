"""GRPO for agents: every step sample of a rollout gets its episode's group-normalised reward.

level="step" (verl-agent): mean/std over all step samples of the group, so long trajectories
weigh more. level="trajectory": mean/std over the K episode rewards. The invalid-action penalty
is subtracted from the step's score before normalising. std is the unbiased sample std; a group
with a single sample (or zero spread without std division) gives advantage 0 there.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from agentrl.advantages.common import Advantages, normalize, register, sample_std
from agentrl.config import Section
from agentrl.rollout.types import group_by_id


class GRPOConfig(Section):
    """GRPO: each step's advantage is its episode return, normalised over the task group."""

    type: Literal["grpo"] = "grpo"
    """Estimator name in the registry."""
    level: Literal["step", "trajectory"] = "step"
    """step: mean/std over all step samples of the group (verl-agent); trajectory: over episodes."""
    normalize_std: bool = True
    """Divide by the group std (False gives Dr.GRPO-style mean-centring only)."""
    eps: float = Field(1e-6, ge=0)
    """Added to the std before dividing."""


@register("grpo", GRPOConfig)
def grpo(trajectories, config) -> Advantages:
    values: dict[int, list[float]] = {}
    for group in group_by_id(trajectories).values():
        scores = {id(t): [t.episode_reward - s.penalty for s in t.steps] for t in group}
        if config.level == "step":
            pool = [x for t in group for x in scores[id(t)]]
        else:
            pool = [t.episode_reward for t in group]
        for t in group:
            values[id(t)] = normalize(scores[id(t)], pool, sample_std(config.normalize_std), config.eps)
    return Advantages([values[id(t)] for t in trajectories])
