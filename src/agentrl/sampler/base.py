"""The sampler protocol: token ids in, sampled token ids and their log-probs out."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Protocol

import torch


@dataclass
class Generation:
    token_ids: list[int]
    """Response tokens, up to and including the end-of-turn token when one was produced."""
    logprobs: list[float]
    """log p(token) under softmax(logits / temperature) (temperature 1 when greedy), per token."""


class Sampler(Protocol):
    context_length: int | None
    """The most tokens a prompt with its reply may hold (None: unbounded); full-history episodes
    end before their next turn would pass it."""

    def generate(self, prompts: list[list[int]], params) -> list[Generation]: ...

    def update_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load new actor weights (a no-op when the sampler shares the actor's module)."""
        ...

    def sleep(self) -> None:
        """Free what the sampler holds while the actor trains (until the next update_weights)."""
        ...


class StreamingSampler(Sampler, Protocol):
    """A sampler that takes requests one at a time and returns generations as they finish
    (continuous batching); asynchronous rollouts hand it each episode as soon as it is ready."""

    def start(self, key: int, prompt: list[int], params) -> None: ...

    def advance(self) -> list[tuple[int, Generation]]:
        """Do one unit of work on the requests in flight; the (key, generation) pairs it finished."""
        ...
