"""Actor backends, registered by name with their config class (`agentrl.registry.ACTORS`, chosen by
`rl.actor.backend`). A backend builder is `(config, model, optim, extra_parameters) -> Actor`
(`agentrl.actor.base.Actor`); `extra_parameters` are trained beside the model (e.g. a classifier
head of an auxiliary loss)."""

from __future__ import annotations

from agentrl.config import FSDP2ActorConfig, SingleActorConfig, ZeRO2ActorConfig, ZeRO3ActorConfig
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
