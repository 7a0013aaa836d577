import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # Triton kernels run on CPU tensors only under the interpreter

import pytest
import torch

from agentrl.config import HouseholdEnvConfig, PromptConfig, TinyModelConfig
from agentrl.envs import make_env
from agentrl.models import init_tiny_model

torch.set_num_threads(2)

COMPACT = "Task: {task}\nHistory:\n{history}\nObservation: {observation}\nActions: {actions}"


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A random-init tiny Qwen2 + tokenizer trained on household text (the demo's shape, smaller)."""
    out = tmp_path_factory.mktemp("tiny")
    init_tiny_model(out, TinyModelConfig(layers=2, intermediate_size=256, corpus_episodes=60),
                    make_env(HouseholdEnvConfig()), PromptConfig(template=COMPACT, history_length=1))
    return out
