"""Environments, registered by name with their config class (`agentrl.registry.ENVIRONMENTS`).

The built-ins are registered by an entry-point string, so an engine's packages are imported only
when a recipe uses it.
"""

from __future__ import annotations

from agentrl.config import AlfWorldEnvConfig, HouseholdEnvConfig, ScienceWorldEnvConfig
from agentrl.envs.base import Environment, Observation, StepResult
from agentrl.registry import ENVIRONMENTS

ENVIRONMENTS.register("household", HouseholdEnvConfig, "agentrl.envs.household:HouseholdEnv")
ENVIRONMENTS.register("alfworld", AlfWorldEnvConfig, "agentrl.envs.alfworld:AlfWorldEnv")
ENVIRONMENTS.register("scienceworld", ScienceWorldEnvConfig, "agentrl.envs.scienceworld:ScienceWorldEnv")


def make_env(config) -> Environment:
    """Build the environment a config section names (its `type`), passing the other fields."""
    return ENVIRONMENTS.get(config.type)(**config.model_dump(exclude={"type"}))


__all__ = ["ENVIRONMENTS", "Environment", "Observation", "StepResult", "make_env"]
