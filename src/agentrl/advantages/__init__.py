"""Advantage estimators, registered by name: trajectories of task groups -> one advantage per step.

Each estimator is a function `(trajectories, config) -> Advantages`, one file each, registered
with its config class: `@register("grpo", GRPOConfig)` (the same as
`agentrl.registry.ADVANTAGES.register`). The trainer calls it with the non-aborted trajectories;
group membership comes from `Trajectory.group_id`.
"""

from __future__ import annotations

from agentrl.advantages.common import Advantages, register  # noqa: F401  (the plugin API)
from agentrl.registry import ADVANTAGES


def compute_advantages(trajectories, config) -> Advantages:
    return ADVANTAGES.get(config.type)(trajectories, config)


from agentrl.advantages import gagpo, gigpo, grpo, ppo, rloo, rlvmr  # noqa: E402,F401  (they register)
