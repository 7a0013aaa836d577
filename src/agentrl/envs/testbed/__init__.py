from agentrl.envs.testbed.env import TestbedConfig, TestbedEnv

__all__ = ["TestbedConfig", "TestbedEnv"]
