"""Training samples and their packing into padded micro-batches.

A `TrainSample` is a token sequence with a mask of the tokens that are trained (the response)
and per-trained-token values (old log-probs, advantages, ...). Micro-batches hold whole samples
within a token budget; every per-token tensor is flat, (N,), in row-major order of the mask.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class TrainSample:
    ids: list[int]
    mask: list[bool]
    """True at trained tokens; the first token is never trained (nothing predicts it)."""
    values: dict[str, list[float]] = field(default_factory=dict)
    """Per trained token, in order: e.g. old_logprobs, advantages, ref_logprobs."""

    @classmethod
    def from_turn(cls, prompt_ids: list[int], response_ids: list[int], **values: list[float]):
        return cls(prompt_ids + response_ids, [False] * len(prompt_ids) + [True] * len(response_ids),
                   dict(values))

    @property
    def n_targets(self) -> int:
        return sum(self.mask)


@dataclass
class TokenBatch:
    input_ids: torch.Tensor  # (B, L) right-padded
    attention_mask: torch.Tensor  # (B, L)
    mask: torch.Tensor  # (B, L) bool, trained tokens
    values: dict[str, torch.Tensor]  # each (N,), N = mask.sum()
    sample_index: torch.Tensor  # (N,) index into the micro-batch's samples

    @property
    def n_tokens(self) -> int:
        return int(self.mask.sum())

    def to(self, device) -> TokenBatch:
        move = lambda t: t if t is None else t.to(device)  # noqa: E731
        return TokenBatch(move(self.input_ids), move(self.attention_mask), move(self.mask),
                          {k: move(v) for k, v in self.values.items()}, move(self.sample_index))


def collate(samples: list[TrainSample], pad_id: int = 0) -> TokenBatch:
    width = max(len(s.ids) for s in samples)
    input_ids = torch.full((len(samples), width), pad_id, dtype=torch.long)
    attention = torch.zeros((len(samples), width), dtype=torch.long)
    mask = torch.zeros((len(samples), width), dtype=torch.bool)
    for row, s in enumerate(samples):
        input_ids[row, :len(s.ids)] = torch.tensor(s.ids)
        attention[row, :len(s.ids)] = 1
        mask[row, :len(s.ids)] = torch.tensor(s.mask)
    mask[:, 0] = False
    keys = samples[0].values.keys()
    values = {k: torch.tensor([v for s in samples for v in s.values[k]], dtype=torch.float32) for k in keys}
    sample_index = torch.tensor([row for row, s in enumerate(samples) for _ in range(s.n_targets)])
    return TokenBatch(input_ids, attention, mask, values, sample_index)


def micro_batches(samples: list[TrainSample], token_budget: int, pad_id: int = 0) -> list[TokenBatch]:
    """Pack samples (longest first) into micro-batches of at most `token_budget` padded tokens."""
    ordered = sorted(samples, key=lambda s: len(s.ids), reverse=True)
    batches, current = [], []
    for s in ordered:
        width = len(current[0].ids) if current else len(s.ids)
        if current and (len(current) + 1) * width > token_budget:
            batches.append(collate(current, pad_id))
            current = []
        current.append(s)
    if current:
        batches.append(collate(current, pad_id))
    return batches


def budget_chunks(samples: list[TrainSample], token_budget: int):
    """Groups of samples (longest first) whose padded size stays within `token_budget`; each
    group packs into exactly one micro-batch."""
    ordered = sorted(samples, key=lambda s: len(s.ids), reverse=True)
    current: list[TrainSample] = []
    for s in ordered:
        if current and (len(current) + 1) * len(current[0].ids) > token_budget:
            yield current
            current = []
        current.append(s)
    if current:
        yield current
