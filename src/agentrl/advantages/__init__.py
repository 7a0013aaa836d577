"""Advantage estimators, registered by name: trajectories of task groups -> one advantage per step.

Each estimator is a function `(trajectories, config) -> Advantages`, one file each, registered
with its config class: `@register("grpo", GRPOConfig)` (the same as
`agentrl.registry.ADVANTAGES.register`). The trainer calls it with the non-aborted trajectories;
group membership comes from `Trajectory.group_id`.
"""

from __future__ import annotations

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


def compute_advantages(trajectories, config) -> Advantages:
    return ADVANTAGES.get(config.type)(trajectories, config)


from agentrl.advantages import gagpo, gigpo, grpo, ppo, rloo, rlvmr  # noqa: E402,F401  (they register)
