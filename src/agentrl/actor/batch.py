"""Training samples and their packing into padded micro-batches.

A `TrainSample` is a token sequence, a mask of the tokens that are trained (the response) and
named per-trained-token fields that the losses read (old log-probs, advantages, ...). A
`TokenBatch` holds whole samples within a token budget, right-padded; each of its per-token
fields is flat, (N,) over the N trained tokens in row-major order of the mask, or None when
no loss of the batch uses it.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Callable, Iterable, Iterator, TypeVar

import torch

T = TypeVar("T")


@dataclass(kw_only=True)
class TokenFields:
    """The per-trained-token values a loss may read; a field no loss of the batch needs is None."""

    old_logprobs: list[float] | torch.Tensor | None = None
    """log p of the token under the policy that sampled it (the sampler's, at its temperature)."""
    advantages: list[float] | torch.Tensor | None = None
    """The token's advantage (its step's, possibly reweighted per token, e.g. by NTHR)."""
    ref_logprobs: list[float] | torch.Tensor | None = None
    """log p of the token under the reference model (when rl.kl_coef > 0)."""
    weight: list[float] | torch.Tensor | None = None
    """The token's weight in its loss: the loss aggregation's in the RL update (set per
    mini-batch), the SFT token weight (1 on responses, sft.prompt_loss_weight on contexts)."""
    target: list[float] | torch.Tensor | None = None
    """A per-token regression or classification target (the judge classifier's 0/1 label)."""
    is_weight: list[float] | torch.Tensor | None = None
    """Truncated importance weight min(p_actor / p_sampler, rl.tis_cap) of the token (with
    rl.tis_cap): corrects for the sampler's numerics differing from the actor's."""


FIELDS = tuple(f.name for f in fields(TokenFields))


@dataclass
class TrainSample(TokenFields):
    ids: list[int]
    mask: list[bool]
    """True at trained tokens; the first token is never trained (nothing predicts it)."""

    @classmethod
    def from_turn(cls, prompt_ids: list[int], response_ids: list[int], **values: list[float]) -> TrainSample:
        """The response trained, the prompt not; `values` are per response token (TokenFields)."""
        return cls(prompt_ids + response_ids, [False] * len(prompt_ids) + [True] * len(response_ids), **values)

    @property
    def n_targets(self) -> int:
        return sum(self.mask)


@dataclass
class TokenBatch(TokenFields):
    input_ids: torch.Tensor
    """(B, L) right-padded token ids."""
    attention_mask: torch.Tensor
    """(B, L) 1 at real tokens."""
    mask: torch.Tensor
    """(B, L) bool, True at trained tokens; N = mask.sum()."""
    sample_index: torch.Tensor | None = None
    """(N,) the row (sample) of each trained token."""

    @property
    def n_tokens(self) -> int:
        return int(self.mask.sum())

    def to(self, device) -> TokenBatch:
        moved = {name: getattr(self, name) for name in (*FIELDS, "input_ids", "attention_mask", "mask", "sample_index")}
        return replace(self, **{k: v if v is None else v.to(device) for k, v in moved.items()})


def collate(samples: list[TrainSample], pad_id: int = 0) -> TokenBatch:
    """One right-padded batch of `samples`, in their order; a per-token field is set when every
    sample has it (some but not all is an error: the losses would read misaligned values)."""
    width = max(len(s.ids) for s in samples)
    input_ids = torch.full((len(samples), width), pad_id, dtype=torch.long)
    attention = torch.zeros((len(samples), width), dtype=torch.long)
    mask = torch.zeros((len(samples), width), dtype=torch.bool)
    for row, s in enumerate(samples):
        input_ids[row, :len(s.ids)] = torch.tensor(s.ids)
        attention[row, :len(s.ids)] = 1
        mask[row, :len(s.ids)] = torch.tensor(s.mask)
    mask[:, 0] = False
    values = {}
    for name in FIELDS:
        present = [getattr(s, name) is not None for s in samples]
        if any(present) and not all(present):
            raise ValueError(f"collate: {sum(present)} of {len(samples)} samples have {name}")
        if all(present):
            values[name] = torch.tensor([v for s in samples for v in getattr(s, name)], dtype=torch.float32)
    sample_index = torch.tensor([row for row, s in enumerate(samples) for _ in range(s.n_targets)], dtype=torch.long)
    return TokenBatch(input_ids, attention, mask, sample_index, **values)


def budget_chunks(items: Iterable[T], token_budget: int, length: Callable[[T], int] = lambda s: len(s.ids)
                  ) -> Iterator[list[T]]:
    """Groups of items (longest first) whose padded size (count x longest) stays within
    `token_budget`; a single item longer than the budget is a group of its own."""
    ordered = sorted(items, key=length, reverse=True)
    current: list = []
    for item in ordered:
        if current and (len(current) + 1) * length(current[0]) > token_budget:
            yield current
            current = []
        current.append(item)
    if current:
        yield current


def micro_batches(samples: list[TrainSample], token_budget: int, pad_id: int = 0) -> list[TokenBatch]:
    """Pack samples (longest first) into micro-batches of at most `token_budget` padded tokens."""
    return [collate(chunk, pad_id) for chunk in budget_chunks(samples, token_budget)]


def per_sample(samples: list[TrainSample], token_budget: int, pad_id: int,
               compute: Callable[[list[TokenBatch]], list[torch.Tensor]]) -> list[torch.Tensor]:
    """`compute(batches)` -> one (N, ...) tensor per trained token of each batch, run on the
    samples packed into budget-sized micro-batches, split back into one tensor (n_targets, ...)
    per sample, in the order of `samples`."""
    chunks = list(budget_chunks(samples, token_budget))
    out: dict[int, torch.Tensor] = {}
    for chunk, values in zip(chunks, compute([collate(c, pad_id) for c in chunks])):
        for s, part in zip(chunk, values.split([s.n_targets for s in chunk])):
            out[id(s)] = part
    return [out[id(s)] for s in samples]
