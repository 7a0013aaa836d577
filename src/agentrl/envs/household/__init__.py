from agentrl.envs.household.env import HouseholdEnv

__all__ = ["HouseholdEnv"]
