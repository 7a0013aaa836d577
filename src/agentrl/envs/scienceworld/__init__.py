from agentrl.envs.scienceworld.env import ScienceWorldEnv

__all__ = ["ScienceWorldEnv"]
