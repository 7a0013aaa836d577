from agentrl.envs.alfworld.env import AlfWorldEnv

__all__ = ["AlfWorldEnv"]
