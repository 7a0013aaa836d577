"""Actor backends, registered by name with their config class (`agentrl.registry.ACTORS`, chosen by
`rl.actor.backend`). A backend builder is `(config, model, optim, extra_parameters) -> Actor`
(`agentrl.actor.base.Actor`); `extra_parameters` are trained beside the model (e.g. a classifier
head of an auxiliary loss)."""

from __future__ import annotations

import os
from typing import Literal

import torch
from pydantic import Field

from agentrl.config import ConfigError, Section
from agentrl.registry import ACTORS


class LoRAConfig(Section):
    """Train low-rank adapters (peft) instead of the full weights; the KL reference is the base
    model with the adapters switched off (no second copy of the weights)."""

    r: int = Field(16, ge=1)
    """Adapter rank."""
    alpha: float = Field(32.0, gt=0)
    """Scale: the update is alpha / r x B A."""
    dropout: float = Field(0.0, ge=0, lt=1)
    """Dropout on the adapters' input."""
    target_modules: list[str] = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    """Linear layers that get adapters."""


class _ActorConfig(Section):
    activation_checkpointing: bool = False
    """Recompute each decoder layer's activations in backward (less memory, more compute)."""
    lora: LoRAConfig | None = None
    """LoRA adapters (needs `pip install 'agentrl[peft]'`)."""


class SingleActorConfig(_ActorConfig):
    """One process (CPU or one GPU)."""

    backend: Literal["single"] = "single"
    """Which actor trains the policy (the trainer is the same for all): single, fsdp2, zero2, zero3."""


class _ShardedActorConfig(_ActorConfig):
    """Sharded over the ranks of `torchrun` / `accelerate launch` (gloo on CPU, nccl on GPUs)."""

    mixed_precision: bool = True
    """On CUDA: bf16 compute, fp32 gradient reduction and master weights."""
    cpu_offload: bool = False
    """Keep parameters (fsdp2, zero3), gradients and optimizer state in CPU memory."""


class FSDP2ActorConfig(_ShardedActorConfig):
    """torch FSDP2 (`fully_shard`), each decoder layer its own unit."""

    backend: Literal["fsdp2"] = "fsdp2"
    """torch FSDP2."""


class ZeRO2ActorConfig(_ShardedActorConfig):
    """DeepSpeed ZeRO stage 2 (`pip install 'agentrl[deepspeed]'`)."""

    backend: Literal["zero2"] = "zero2"
    """DeepSpeed ZeRO-2."""


class ZeRO3ActorConfig(_ShardedActorConfig):
    """DeepSpeed ZeRO stage 3 (`pip install 'agentrl[deepspeed]'`)."""

    backend: Literal["zero3"] = "zero3"
    """DeepSpeed ZeRO-3."""


@ACTORS.register("single", SingleActorConfig)
def single(config, model, optim, extra_parameters):
    from agentrl.actor.single import SingleActor
    if config.activation_checkpointing:
        model.gradient_checkpointing_enable()
    return SingleActor(model, optim, extra_parameters)


def _sharded_only(config, extra_parameters) -> None:
    if extra_parameters:
        raise ValueError(f"extra trained parameters need actor.backend: single, not {config.backend}")


@ACTORS.register("fsdp2", FSDP2ActorConfig)
def fsdp2(config, model, optim, extra_parameters):
    from agentrl.actor.fsdp import FSDPActor
    _sharded_only(config, extra_parameters)
    return FSDPActor(model, optim, config.mixed_precision, config.cpu_offload, config.activation_checkpointing)


@ACTORS.register("zero2", ZeRO2ActorConfig)
@ACTORS.register("zero3", ZeRO3ActorConfig)
def zero(config, model, optim, extra_parameters):
    from agentrl.actor.deepspeed import DeepSpeedActor
    _sharded_only(config, extra_parameters)
    return DeepSpeedActor(model, optim, int(config.backend[-1]), config.mixed_precision, config.cpu_offload,
                          config.activation_checkpointing)


def shards_on_load(config) -> bool:
    """Whether the actor reads each rank's shards itself (`models.load_model(empty=True)`): FSDP2
    without LoRA. (LoRA's adapters are initialised on the whole model; DeepSpeed loads it whole.)"""
    return config.backend == "fsdp2" and getattr(config, "lora", None) is None


def check_launch(actor, field: str, world: int) -> None:
    """ConfigError unless the actor section `actor` (at `field` of the recipe) works on `world`
    ranks: a sharded backend needs a launcher, also for one rank; the one-process actor trains
    one model per rank, so it needs exactly one."""
    if actor.backend != "single" and "WORLD_SIZE" not in os.environ and not torch.distributed.is_initialized():
        hint = ("; `accelerate launch --cpu` starts one process whatever --num_processes says: on CPU use "
                "--config_file recipes/accelerate/cpu.yaml (or --multi_gpu --num_processes N: gloo ranks)"
                if os.environ.get("ACCELERATE_USE_CPU", "").lower() == "true" else "")
        raise ConfigError(f"{field}.backend: {actor.backend} shards over ranks: launch with `torchrun "
                          f"--nproc_per_node N --no-python agentrl ...` or `accelerate launch --config_file "
                          f"recipes/accelerate/<cpu|gpu1|node8|nodes2>.yaml --no_python agentrl ...`{hint}")
    if world > 1 and actor.backend == "single":
        raise ConfigError(f"{field}.backend: single trains in one process; with {world} ranks each would "
                          f"train a model of its own: use fsdp2, zero2 or zero3")
