"""Environments, registered by name with their config class (`agentrl.registry.ENVIRONMENTS`),
each in its own package the way a plugin is written. An engine's own packages (ALFWorld,
ScienceWorld) are imported only when an environment of it is built.
"""

from __future__ import annotations

from agentrl.envs.base import Environment, Observation, StepResult, make_env
from agentrl.registry import ENVIRONMENTS

from agentrl.envs import alfworld, household, latency, scienceworld, testbed  # noqa: E402,F401  (they register)

__all__ = ["ENVIRONMENTS", "Environment", "Observation", "StepResult", "make_env"]
