"""Training samples and their packing into padded micro-batches.

A `TrainSample` is a token sequence, a mask of the tokens that are trained (the response) and
named per-trained-token fields that the losses read (old log-probs, advantages, ...). A
`TokenBatch` holds whole samples within a token budget, right-padded; each of its per-token
fields is flat, (N,) over the N trained tokens in row-major order of the mask, or None when
no loss of the batch uses it.

Prefix packing (`pack=True`): one environment step is one sample, so the samples of a task
group repeat the same prompt again and again. Samples whose tokens before their first trained
token (their prefix: the prompt) are identical form a tree: the prefix once, then each sample's
suffix, every suffix continuing the prefix's positions and attending to the prefix and to itself
only (a 4-D mask, as in Prefix Grouper and Tree Training). Trees are placed side by side in rows
of up to `ROW_TOKENS` tokens (or twice the longest sample), so rows are full and little is
padding. The prefix's activations are computed once and receive the gradients of every suffix;
each trained token's log-prob is the one the unpacked batch gives (up to float summation order).
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
    """(N,) the sample (its place in the batch's order) of each trained token."""
    position_ids: torch.Tensor | None = None
    """(B, L) packed rows only: each suffix continues its prefix's positions."""
    tree: torch.Tensor | None = None
    """(B, L) packed rows only: the prefix tree of the row each token belongs to (-1: padding)."""
    branch: torch.Tensor | None = None
    """(B, L) packed rows only: 0 on a tree's shared prefix, k on the row's k-th suffix, -1 on padding."""
    predict: torch.Tensor | None = None
    """(N,) packed rows only: the flat position (row x L + column) whose hidden state predicts
    each trained token (a suffix's first token is predicted by the prefix's last)."""

    @property
    def n_tokens(self) -> int:
        return int(self.mask.sum())

    @property
    def n_computed(self) -> int:
        """Tokens the forward pass runs (real tokens of the rows, padding excluded)."""
        return int(self.attention_mask.sum())

    def to(self, device) -> TokenBatch:
        moved = {name: getattr(self, name) for name in (*FIELDS, *LAYOUT)}
        return replace(self, **{k: v if v is None else v.to(device) for k, v in moved.items()})

    def layout(self) -> tuple:
        """The tensors that say what the model computes (`LAYOUT`, in order)."""
        return tuple(getattr(self, name) for name in LAYOUT)


LAYOUT = ("input_ids", "attention_mask", "mask", "sample_index", "position_ids", "tree", "branch", "predict")


def packed_attention(tree: torch.Tensor, branch: torch.Tensor) -> torch.Tensor:
    """(B, 1, L, L) bool, True where a query may attend a key: causal, within its tree, to the
    tree's prefix and to its own suffix (a padding query sees itself, so no row of the mask is empty)."""
    length = branch.shape[1]
    causal = torch.ones(length, length, dtype=torch.bool, device=branch.device).tril()
    same_tree = (tree[:, :, None] == tree[:, None, :]) & (tree[:, None, :] >= 0)
    query, key = branch[:, :, None], branch[:, None, :]
    itself = torch.eye(length, dtype=torch.bool, device=branch.device)
    return ((causal & same_tree & ((key == 0) | (key == query))) | itself)[:, None]


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
    return TokenBatch(input_ids, attention, mask, **_fields(samples))


def _fields(samples: list[TrainSample]) -> dict:
    """The per-token fields of `samples` (flat, in their order) and each trained token's sample."""
    values = {}
    for name in FIELDS:
        present = [getattr(s, name) is not None for s in samples]
        if any(present) and not all(present):
            raise ValueError(f"collate: {sum(present)} of {len(samples)} samples have {name}")
        if all(present):
            values[name] = torch.tensor([v for s in samples for v in getattr(s, name)], dtype=torch.float32)
    values["sample_index"] = torch.tensor([i for i, s in enumerate(samples) for _ in range(s.n_targets)], dtype=torch.long)
    return values


def prefix_length(sample: TrainSample) -> int:
    """Tokens before the first trained one (the first token is never trained): the part a packed
    row shares."""
    return next((t for t in range(1, len(sample.ids)) if sample.mask[t]), len(sample.ids))


def trees(row: list[TrainSample]) -> list[list[TrainSample]]:
    """The row's runs of consecutive samples with the same prefix: each is computed as one tree."""
    runs: list[list[TrainSample]] = []
    for s in row:
        if runs and s.ids[:prefix_length(s)] == runs[-1][0].ids[:prefix_length(runs[-1][0])]:
            runs[-1].append(s)
        else:
            runs.append([s])
    return runs


def row_length(row: list[TrainSample]) -> int:
    return sum(prefix_length(tree[0]) + sum(len(s.ids) - prefix_length(s) for s in tree) for tree in trees(row))


def collate_rows(rows: list[list[TrainSample]], pad_id: int = 0) -> TokenBatch:
    """One packed batch: in each row, every run of samples with the same prefix is one tree (the
    prefix's tokens once, then each sample's suffix), trees side by side. The trained tokens and
    per-token fields are in the order of the rows' samples, as `collate` of them gives them."""
    width = max(row_length(row) for row in rows)
    shape = (len(rows), width)
    input_ids = torch.full(shape, pad_id, dtype=torch.long)
    attention, mask = torch.zeros(shape, dtype=torch.long), torch.zeros(shape, dtype=torch.bool)
    positions, tree_of = torch.zeros(shape, dtype=torch.long), torch.full(shape, -1, dtype=torch.long)
    branch = torch.full(shape, -1, dtype=torch.long)
    predict = []
    for r, row in enumerate(rows):
        at, k = 0, 0  # the next free column of the row; the row's last suffix number
        for j, tree in enumerate(trees(row)):
            size = prefix_length(tree[0])
            start = at
            columns = slice(at, at + size)
            input_ids[r, columns], positions[r, columns] = torch.tensor(tree[0].ids[:size]), torch.arange(size)
            tree_of[r, columns], branch[r, columns] = j, 0
            at += size
            for s in tree:
                k += 1
                suffix = s.ids[size:]
                columns = slice(at, at + len(suffix))
                input_ids[r, columns], positions[r, columns] = torch.tensor(suffix), torch.arange(size, len(s.ids))
                tree_of[r, columns], branch[r, columns], mask[r, columns] = j, k, torch.tensor(s.mask[size:])
                # Token t of the sample is predicted at t - 1: the prefix's last column for t == size.
                predict += [r * width + (start + size - 1 if t == size else at + t - 1 - size)
                            for t in range(size, len(s.ids)) if s.mask[t]]
                at += len(suffix)
        attention[r, :at] = 1
    samples = [s for row in rows for s in row]
    return TokenBatch(input_ids, attention, mask, position_ids=positions, tree=tree_of, branch=branch,
                      predict=torch.tensor(predict, dtype=torch.long), **_fields(samples))


def prefix_rows(samples: list[TrainSample], max_row: int) -> list[list[TrainSample]]:
    """Samples grouped by prefix into trees (a tree longer than `max_row` tokens cut into several),
    the trees placed into rows of at most `max_row` tokens, largest first, each into the first row
    with room (first-fit decreasing), so rows are full and padding is small. A tree longer than
    `max_row` on its own (one long sample) gets a row of its own."""
    groups: dict[tuple[int, ...], list[TrainSample]] = {}
    for s in samples:
        groups.setdefault(tuple(s.ids[:prefix_length(s)]), []).append(s)
    cut: list[tuple[int, list[TrainSample]]] = []  # (tokens, samples) of each tree
    for prefix, members in groups.items():
        tree, length = [], len(prefix)
        for s in members:
            extra = len(s.ids) - len(prefix)
            if tree and length + extra > max_row:
                cut.append((length, tree))
                tree, length = [], len(prefix)
            tree.append(s)
            length += extra
        cut.append((length, tree))
    rows: list[tuple[int, list[TrainSample]]] = []
    for length, tree in sorted(cut, key=lambda item: item[0], reverse=True):
        fit = next((i for i, (used, _) in enumerate(rows) if used + length <= max_row), None)
        if fit is None:
            rows.append((length, list(tree)))
        else:
            rows[fit] = (rows[fit][0] + length, rows[fit][1] + tree)
    return [row for _, row in rows]


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


# A packed row's attention is dense over the row (quadratic in its length): rows are filled up to
# ROW_TOKENS, or twice the longest sample so that a long prompt still shares its row with several
# responses. Measured on the demo's step samples (2-layer model, 1 thread): forward + backward
# 2.1-2.2 s with rows of 256-512 tokens, 2.6 s at 1,024, 3.5 s at 2,048, 6.6 s unpacked.
ROW_TOKENS = 512


def _chunks(samples: list[TrainSample], token_budget: int, pad_id: int, pack: bool
            ) -> list[tuple[list[TrainSample], TokenBatch]]:
    """(the samples of a micro-batch in its token order, the micro-batch) within `token_budget`
    padded tokens, longest rows first; with `pack`, samples sharing a prefix share rows."""
    if not pack or not samples:
        return [(chunk, collate(chunk, pad_id)) for chunk in budget_chunks(samples, token_budget)]
    rows = prefix_rows(samples, min(token_budget, max(ROW_TOKENS, 2 * max(len(s.ids) for s in samples))))
    return [([s for row in chunk for s in row], collate_rows(chunk, pad_id))
            for chunk in budget_chunks(rows, token_budget, length=row_length)]


def micro_batches(samples: list[TrainSample], token_budget: int, pad_id: int = 0, pack: bool = False
                  ) -> list[TokenBatch]:
    """Samples (longest first) in micro-batches of at most `token_budget` padded tokens, with
    `pack` each shared prefix computed once (see the module docstring)."""
    return [batch for _, batch in _chunks(samples, token_budget, pad_id, pack)]


def per_sample(samples: list[TrainSample], token_budget: int, pad_id: int,
               compute: Callable[[list[TokenBatch]], list[torch.Tensor]], pack: bool = False) -> list[torch.Tensor]:
    """`compute(batches)` -> one (N, ...) tensor per trained token of each batch, run on the
    samples in budget-sized micro-batches (packed with `pack`), split back into one tensor
    (n_targets, ...) per sample, in the order of `samples`."""
    chunks = _chunks(samples, token_budget, pad_id, pack)
    out: dict[int, torch.Tensor] = {}
    for (chunk, _), values in zip(chunks, compute([batch for _, batch in chunks])):
        for s, part in zip(chunk, values.split([s.n_targets for s in chunk])):
            out[id(s)] = part
    return [out[id(s)] for s in samples]
