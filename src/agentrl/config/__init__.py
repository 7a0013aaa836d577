"""Run configuration: pydantic models loaded from YAML recipes.

Every model forbids unknown keys and documents each field. A variant section (environment,
advantage estimator, policy loss, auxiliary loss, sampler, actor backend) is validated by the
config class registered under its `type` (`agentrl.registry`), so plugins enter through recipes
like built-ins. `agentrl.recipe.load_config` turns any validation error into a `ConfigError` that
names the offending field and the recipe file. Here: the recipe's top level (`Config`); the shared
sections in `config/sections.py`, the RL section in `config/rl.py`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from agentrl.config.rl import (
    EnvPoolConfig,
    RaySectionConfig,
    RLConfig,
    RolloutConfig,
)
from agentrl.config.sections import (
    DaggerConfig,
    EvalConfig,
    ModelConfig,
    OptimConfig,
    PromptConfig,
    SamplingConfig,
    Section,
    SFTConfig,
    TinyModelConfig,
)
from agentrl.errors import ConfigError
from agentrl.registry import ACTORS, ENVIRONMENTS

__all__ = ["Config", "ConfigError", "DaggerConfig", "EnvPoolConfig", "EvalConfig", "ModelConfig", "OptimConfig",
           "PromptConfig", "RLConfig", "RaySectionConfig", "RolloutConfig", "SFTConfig", "SamplingConfig",
           "Section", "TinyModelConfig"]


class Config(Section):
    seed: int = 0
    """Seeds everything random: task draws, sampling, shuffles, initialisations."""
    run_dir: str = "runs/demo"
    """Everything the run writes goes here: config, logs, checkpoints, results."""
    model: ModelConfig = Field(default_factory=ModelConfig)
    """The starting model."""
    init: TinyModelConfig | None = None
    """When set, the pipeline first creates a tiny model at model.path."""
    imports: list[str] = []
    """Plugin modules (`my_pkg.plugin`) or files (`my_plugin.py`, relative to the recipe's folder)
    imported before the rest is validated; a saved config.yaml lists them as loaded."""
    env: Annotated[Section, ENVIRONMENTS.field("household")] = Field(default_factory=lambda: ENVIRONMENTS.make("household"))
    """The environment, by `type` (household, alfworld, scienceworld, or a plugin's)."""
    prompt: PromptConfig = Field(default_factory=PromptConfig)
    """How a step's prompt is built and a response parsed."""
    sampling: SamplingConfig = Field(default_factory=SamplingConfig)
    """Sampling of training rollouts (and the temperature the policy loss uses)."""
    sft: SFTConfig | None = None
    """Supervised cold start (None: no SFT phase)."""
    rl: RLConfig | None = None
    """The RL phase (None: no RL)."""
    eval: EvalConfig = Field(default_factory=EvalConfig)
    """Evaluation after each phase."""
    tracking: list[Literal["tensorboard", "wandb"]] = ["tensorboard"]
    """Where metrics go besides each phase's logs/metrics.jsonl: TensorBoard (logs/tb) and/or
    Weights & Biases (`pip install wandb`; project, entity and mode from WANDB_PROJECT,
    WANDB_ENTITY, WANDB_MODE=offline, ...; runs grouped by run_dir)."""

    @field_validator("tracking")
    @classmethod
    def _tracker_installed(cls, tracking: list[str]) -> list[str]:
        import importlib.util

        if "wandb" in tracking and importlib.util.find_spec("wandb") is None:
            raise ValueError("wandb is not installed: pip install wandb")
        return tracking

    @model_validator(mode="after")
    def _sft_actor_defaults_to_rl(self):
        if self.sft is not None and self.sft.actor is None:
            self.sft.actor = self.rl.actor.model_copy(deep=True) if self.rl is not None else ACTORS.make("single")
        return self

    @model_validator(mode="after")
    def _judgments_need_valid_actions(self):
        if self.sft is not None and self.sft.judgments and getattr(self.env, "valid_actions", True) is False:
            raise ValueError("sft.judgments plays random valid actions: it needs env.valid_actions: true")
        return self

    @model_validator(mode="after")
    def _rl_task_types_need_env_types(self):
        if self.rl is not None and self.rl.train_task_types is not None and "train_task_types" not in type(self.env).model_fields:
            raise ValueError(f"rl.train_task_types: env {self.env.type!r} has no env.train_task_types to replace")
        return self

    def rl_env(self) -> Section:
        """The env section RL's rollouts play: env with rl.train_task_types in place of its own."""
        if self.rl is None or self.rl.train_task_types is None:
            return self.env
        types = None if self.rl.train_task_types == "all" else self.rl.train_task_types
        return self.env.model_copy(update={"train_task_types": types})

    @model_validator(mode="after")
    def _full_history_readers(self):
        """With prompt.full_history a step's prompt text is its own turn only: what re-reads a
        step from that text (the GCD judge, the coupling lab, judgment data) would miss the rest."""
        if not self.prompt.full_history:
            return self
        rl = self.rl
        readers = [f"{where} ({section.type})" for where, section in [
            *((f"rl.aux[{i}]", a) for i, a in enumerate(rl.aux if rl else [])),
            *((f"rl.components[{i}]", c) for i, c in enumerate(rl.components if rl else []))]
            if getattr(section, "reads_prompt_text", False)]
        if self.sft is not None and self.sft.judgments:
            readers.append("sft.judgments")
        if readers:
            raise ValueError(f"{readers[0]} reads a step's prompt as text: not yet with prompt.full_history")
        return self

    @model_validator(mode="after")
    def _init_model_follows_run_dir(self):
        if self.model.path is None and self.init is not None:
            self.model.path = str(Path(self.run_dir) / "model-init")
        return self
