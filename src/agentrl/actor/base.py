"""The actor protocol: what the trainer needs from a policy backend (single process, FSDP2, ...).

The trainer hands the actor a loss function per micro-batch, returning the batch's loss and
metrics (`agentrl.metrics.LossOutputs`); the loss is already divided by the *global* count it is
averaged over, so summing micro-batch gradients gives the same update whatever the micro-batch or
rank split.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Iterable, Protocol

import torch

from agentrl.metrics import LossOutputs, Tally
from agentrl.packing import TokenBatch

LossFn = Callable[[TokenBatch], LossOutputs]


def backward_all(work: list[tuple[TokenBatch, LossFn, float]], device, backward: Callable[[torch.Tensor, bool], None]
                 ) -> Tally:
    """Every backend's gradient accumulation: for each (batch, loss_fn, scale) of `work`, the loss
    of the batch (moved to `device`) times `scale` goes to `backward(loss, last)` (`last` marks the
    final micro-batch, where gradients are synchronised); the metrics of the micro-batches with a
    non-zero scale (not the zero-weighted repeats that pad a rank) are tallied."""
    tally = Tally()
    for i, (batch, loss_fn, scale) in enumerate(work):
        out = loss_fn(batch.to(device))
        backward(out.loss * scale, i == len(work) - 1)
        if scale:
            tally.add(out)
    return tally


def update_metrics(lr: float, grad_norm: float, skipped: bool) -> LossOutputs:
    """What every backend adds to an optimiser step's tally."""
    return LossOutputs(torch.zeros(()), per_update={"lr": lr, "grad_norm": grad_norm},
                       counts={"skipped_updates": float(skipped)})


class Actor(Protocol):
    def token_logprobs(self, batch: TokenBatch, temperature: float = 1.0, entropy: bool = False
                       ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """log p(token) (N,) and optionally the entropy (N,) at the batch's trained tokens."""
        ...

    def score_logprobs(self, batches: list[TokenBatch], temperature: float = 1.0) -> list[torch.Tensor]:
        """log p (N,) of each batch's trained tokens, without gradients. With several ranks every
        rank calls it at once (sharded backends pad to the same number of forward passes)."""
        ...

    def token_hidden(self, batch: TokenBatch) -> torch.Tensor:
        """(N, H): the final hidden state at each position that predicts a trained token."""
        ...

    def optimizer_step(self, parts: list[tuple[list[TokenBatch], LossFn]]) -> Tally:
        """One optimiser step: for each (micro-batches, loss_fn) part accumulate the gradients of
        loss_fn over its micro-batches; clip, step; returns the metrics of every rank, with the
        learning rate and gradient norm (per update) and whether the step was skipped (a count)."""
        ...

    def weights(self) -> Iterable[tuple[str, torch.Tensor]]:
        """Full (gathered) weights for the sampler."""
        ...

    def save(self, path: Path) -> None: ...

    def load(self, path: Path) -> None: ...


def make_optimizer(parameters, optim):
    """AdamW with a constant learning rate after a linear warmup (every actor backend)."""
    optimizer = torch.optim.AdamW(parameters, lr=optim.lr, betas=tuple(optim.betas), weight_decay=optim.weight_decay)
    warmup = optim.warmup_steps
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min(1.0, (step + 1) / warmup) if warmup else 1.0)
    return optimizer, scheduler
