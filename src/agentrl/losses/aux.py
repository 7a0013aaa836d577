"""Auxiliary losses: named loss components on extra samples, added to the RL loss in the same
optimiser step (the GCD judge is one; SFT on a chat dataset, e.g. judgment data, is another).

An `AuxLoss` is a trainer component (`agentrl.components`) that turns the step's rollouts into
its own training samples and metrics (`prepare`) and scores them (`loss`: per-token losses from
the actor's log-probs or hidden states). The trainer normalises each by its own token count, adds
`weight * loss`, and logs the metrics as aux/<name>/... Auxiliary losses are registered by name
with their config class (`agentrl.registry.AUX_LOSSES`); a builder is
`(config, context: agentrl.components.Context) -> AuxLoss`.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Literal, Protocol

import torch
from pydantic import Field

from agentrl.actor.base import LossFn
from agentrl.components import Component
from agentrl.config import Section
from agentrl.metrics import LossOutputs
from agentrl.packing import TokenBatch, TrainSample
from agentrl.registry import AUX_LOSSES


class ChatSFTAuxConfig(Section):
    """Auxiliary NLL on a JSONL chat dataset (e.g. judgment data), added to every RL update."""

    type: Literal["chat_sft"] = "chat_sft"
    """Auxiliary loss name in the registry."""
    name: str = "sft"
    """Metric namespace: aux/<name>/loss."""
    data: str
    """JSONL chat dataset (see `agentrl data`)."""
    batch_size: int = Field(16, ge=1)
    """Examples drawn per training step."""
    weight: float = Field(0.1, ge=0)
    """Weight of this loss next to the policy loss."""


@dataclass
class AuxBatch:
    samples: list[TrainSample]
    metrics: dict[str, float] = field(default_factory=dict)


class AuxLoss(Protocol):
    name: str
    weight: float

    def prepare(self, trajectories, step: int) -> AuxBatch: ...

    def loss(self, actor, batch: TokenBatch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Per-token loss (N,) of the batch's trained tokens, from `actor.token_logprobs(batch)`
        or `actor.token_hidden(batch)`, and summed counts for metrics (divided by the token count)."""
        ...


def aux_part(aux: AuxLoss, actor, n_tokens: float) -> LossFn:
    """An auxiliary loss's part of an update: its per-token losses summed over its `n_tokens`
    (every rank's share of this optimiser step), times its weight."""
    def loss_fn(batch: TokenBatch) -> LossOutputs:
        per_token, counts = aux.loss(actor, batch)
        loss = per_token.sum() / n_tokens
        return LossOutputs(aux.weight * loss, per_update={
            f"aux/{aux.name}/loss": loss.detach(), **{f"aux/{aux.name}/{k}": v / n_tokens for k, v in counts.items()}})
    return loss_fn


class ChatSFTLoss(Component):
    """Negative log-likelihood on assistant tokens of a chat dataset, `batch_size` per step."""

    def __init__(self, name: str, conversations: list[list[dict]], tokenizer, batch_size: int,
                 weight: float, seed: int):
        from agentrl.data import encode_conversation

        self.name, self.weight, self.batch_size = name, weight, batch_size
        self.samples = [encode_conversation(tokenizer, c) for c in conversations]
        self.seed = seed

    def prepare(self, trajectories, step: int) -> AuxBatch:
        rng = random.Random(f"{self.seed}:{self.name}:{step}")
        return AuxBatch(rng.sample(self.samples, min(self.batch_size, len(self.samples))))

    def loss(self, actor, batch):
        return -batch.weight * actor.token_logprobs(batch)[0], {}


@AUX_LOSSES.register("chat_sft", ChatSFTAuxConfig)
def chat_sft(config, ctx):
    from agentrl.data import read_chat_dataset
    return ChatSFTLoss(config.name, read_chat_dataset(config.data), ctx.tokenizer, config.batch_size, config.weight,
                       ctx.config.seed)
