"""Environments, registered by name with their config class (`agentrl.registry.ENVIRONMENTS`).

The built-ins are registered by an entry-point string, so an engine's packages are imported only
when a recipe uses it.
"""

from __future__ import annotations

from agentrl.config import AlfWorldEnvConfig, HouseholdEnvConfig, LatencyEnvConfig, ScienceWorldEnvConfig
from agentrl.envs.base import Environment, Observation, StepResult
from agentrl.envs.testbed.env import TestbedConfig
from agentrl.registry import ENVIRONMENTS

ENVIRONMENTS.register("household", HouseholdEnvConfig, "agentrl.envs.household:HouseholdEnv")
ENVIRONMENTS.register("alfworld", AlfWorldEnvConfig, "agentrl.envs.alfworld:AlfWorldEnv")
ENVIRONMENTS.register("scienceworld", ScienceWorldEnvConfig, "agentrl.envs.scienceworld:ScienceWorldEnv")
ENVIRONMENTS.register("latency", LatencyEnvConfig, "agentrl.envs.latency:LatencyEnv")
ENVIRONMENTS.register("testbed", TestbedConfig, "agentrl.envs.testbed:TestbedEnv")


def make_env(config) -> Environment:
    """Build the environment a config section names (its `type`), passing the other fields."""
    fields = {name: getattr(config, name) for name in type(config).model_fields if name != "type"}
    return ENVIRONMENTS.get(config.type)(**fields)


__all__ = ["ENVIRONMENTS", "Environment", "Observation", "StepResult", "make_env"]
