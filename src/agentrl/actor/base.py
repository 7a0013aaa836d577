"""The actor protocol: what the trainer needs from a policy backend (single process, FSDP2, ...).

The trainer hands the actor a loss function per micro-batch; the loss is already divided by the
*global* count it is averaged over, so summing micro-batch gradients gives the same update
whatever the micro-batch or rank split.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Iterable, Protocol

import torch

from agentrl.actor.batch import TokenBatch

LossFn = Callable[[TokenBatch], tuple[torch.Tensor, dict[str, torch.Tensor]]]


class Actor(Protocol):
    def token_logprobs(self, batch: TokenBatch, temperature: float = 1.0, entropy: bool = False
                       ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """log p(token) (N,) and optionally the entropy (N,) at the batch's trained tokens."""
        ...

    def token_hidden(self, batch: TokenBatch) -> torch.Tensor:
        """(N, H): the final hidden state at each position that predicts a trained token."""
        ...

    def optimizer_step(self, parts: list[tuple[list[TokenBatch], LossFn]]) -> dict[str, float]:
        """One optimiser step: for each (micro-batches, loss_fn) part accumulate the gradients of
        loss_fn over its micro-batches; clip, step; returns the summed metrics."""
        ...

    def weights(self) -> Iterable[tuple[str, torch.Tensor]]:
        """Full (gathered) weights for the sampler."""
        ...

    def save(self, path: Path) -> None: ...

    def load(self, path: Path) -> None: ...
