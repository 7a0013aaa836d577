"""Actor backends, registered by name with their config class (`agentrl.registry.ACTORS`, chosen by
`rl.actor.backend`). A backend builder is `(config, model, optim, extra_parameters) -> Actor`
(`agentrl.actor.base.Actor`); `extra_parameters` are trained beside the model (e.g. a classifier
head of an auxiliary loss)."""

from __future__ import annotations

import os

import torch

from agentrl.config import ConfigError, FSDP2ActorConfig, SingleActorConfig, ZeRO2ActorConfig, ZeRO3ActorConfig
from agentrl.registry import ACTORS


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
