"""Environments registered by name with an entry-point string, built from their config."""

from __future__ import annotations

import importlib

from agentrl.envs.base import Environment, Observation, StepResult

ENVIRONMENTS = {
    "household": "agentrl.envs.household:HouseholdEnv",
    "alfworld": "agentrl.envs.alfworld:AlfWorldEnv",
    "scienceworld": "agentrl.envs.scienceworld:ScienceWorldEnv",
}


def make_env(config) -> Environment:
    """Build the environment a config section names (its `type`), passing the other fields."""
    if config.type not in ENVIRONMENTS:
        raise ValueError(f"unknown environment {config.type!r}; registered: {sorted(ENVIRONMENTS)}")
    module, _, name = ENVIRONMENTS[config.type].partition(":")
    cls = getattr(importlib.import_module(module), name)
    return cls(**config.model_dump(exclude={"type"}))


__all__ = ["ENVIRONMENTS", "Environment", "Observation", "StepResult", "make_env"]
