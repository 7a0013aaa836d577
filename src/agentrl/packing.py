"""Training samples and their packing into padded micro-batches.

A `TrainSample` is a token sequence, a mask of the tokens that are trained (the response) and
named per-trained-token fields that the losses read (old log-probs, advantages, ...). A
`TokenBatch` holds whole samples within a token budget, right-padded; each of its per-token
fields is flat, (N,) over the N trained tokens in row-major order of the mask, or None when
no loss of the batch uses it.

Prefix packing (`pack=Packing(...)`): one environment step is one sample, so the samples of a task
group repeat the same prompt again and again, and the prompts of one episode's steps, or of a
group's rollouts, share their leading part (instructions, task, the first observations). A row
packs samples as a prefix tree: samples are placed in order, each sharing the leading tokens its
prefix (the tokens before its first trained token: the prompt) has in common with the previous
sample's, then its own prefix tokens, then its suffix (the response). Every token keeps its
position in its own sample and attends to its ancestors in the tree only: laid out in depth-first
order, a token's descendants are the columns up to its `subtree_end`, so the 4-D mask is
`key <= query < subtree_end[key]` (as Tree Training; Prefix Grouper is the one-level case). Rows
are sorted by prefix, so similar prompts are neighbours, and filled up to `ROW_TOKENS` tokens
(or twice the longest sample) with the samples whose sharing pays for the longer row's attention
(`Packing`). A shared token's activations are computed once and receive the
gradients of every sample below it; each trained token's log-prob is the one the unpacked batch
gives (up to float summation order).
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
    """(B, L) packed rows only: each token's position in its own sample."""
    subtree_end: torch.Tensor | None = None
    """(B, L) packed rows only: one past the last column of the token's subtree (its descendants
    follow it; a padding column's is its own column + 1)."""
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


LAYOUT = ("input_ids", "attention_mask", "mask", "sample_index", "position_ids", "subtree_end", "predict")


def packed_attention(subtree_end: torch.Tensor) -> torch.Tensor:
    """(B, 1, L, L) bool, True where a query may attend a key: the key is the query or one of its
    ancestors in the row's prefix tree (a padding query sees itself only)."""
    columns = torch.arange(subtree_end.shape[1], device=subtree_end.device)
    query, key = columns[:, None], columns[None, :]
    return ((key <= query) & (query < subtree_end[:, None, :]))[:, None]


def tree_attention(model, subtree_end: torch.Tensor) -> torch.Tensor:
    """`packed_attention` as `model`'s attention takes a 4-D mask: bool for sdpa, additive for eager."""
    attention = packed_attention(subtree_end)
    implementation = model.config._attn_implementation
    if implementation == "eager":
        return torch.zeros(attention.shape, dtype=model.dtype, device=attention.device
                           ).masked_fill(~attention, torch.finfo(model.dtype).min)
    if implementation != "sdpa":
        raise ValueError(f"prefix packing needs sdpa or eager attention, not {implementation!r}: set "
                         "rl.pack_prefixes / sft.pack_prefixes / rl.sampler.share_prefixes to false")
    return attention


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


@dataclass(frozen=True)
class Packing:
    """How samples share packed rows. The tree mask makes the attention kernel compute every
    (query, key) pair of a row, so a row of n tokens and width w costs about n + pair_cost x w^2
    tokens' work (a sample alone on a row: its length and its square). A sample joins a row only
    when the row with it costs less than the row without it plus the sample on a row of its own:
    sharing a long prompt pays for a longer row, sharing a few instruction tokens between long
    prompts does not (with a small model's relatively costly attention, such rows made the
    update slower than unpacked; `benchmarks/packed_update.py`)."""

    pair_cost: float = 0.0
    """The work of one (query, key) pair of attention in units of one token's work in the linear
    layers (`for_model`); 0: a sample joins whenever it shares a leading token and fits."""

    @classmethod
    def for_model(cls, config) -> Packing:
        """The pair cost of a decoder's config, per layer: attention does 4 x heads x head_dim
        flops per pair, the linear layers (q, k, v, o projections and a gated MLP) 2 x their
        weights per token (the output layer's work is the same packed or not)."""
        heads = config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        kv_heads = getattr(config, "num_key_value_heads", None) or heads
        weights = config.hidden_size * (head_dim * (2 * heads + 2 * kv_heads) + 3 * config.intermediate_size)
        return cls(4 * heads * head_dim / (2 * weights))


def prefix_length(sample: TrainSample) -> int:
    """Tokens before the first trained one (the first token is never trained): the part a packed
    row shares."""
    for t in range(1, len(sample.ids)):
        if sample.mask[t]:
            return t
    return len(sample.ids)


def _shared(a: list[int], b: list[int]) -> int:
    """How many leading tokens `a` and `b` have in common."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b))


def row_length(row: list[TrainSample]) -> int:
    """Tokens of the row packed as a prefix tree (each prefix shares its lead with the previous one's)."""
    total, previous = 0, []
    for s in row:
        prefix = s.ids[:prefix_length(s)]
        total += len(s.ids) - _shared(prefix, previous)
        previous = prefix
    return total


def tree_columns(row: list[TrainSample]) -> list[list[int]]:
    """The column of each token of each sample of a row packed as a prefix tree: a sample's
    leading prefix tokens in common with the previous sample's prefix sit in that one's columns,
    the rest in new columns after the row's last."""
    out, path, previous, n = [], [], [], 0
    for s in row:
        size = prefix_length(s)
        shared = _shared(s.ids[:size], previous)
        columns = path[:shared] + list(range(n, n + len(s.ids) - shared))
        n += len(s.ids) - shared
        out.append(columns)
        path, previous = columns[:size], s.ids[:size]
    return out


def collate_rows(rows: list[list[TrainSample]], pad_id: int = 0) -> TokenBatch:
    """One packed batch: each row a prefix tree of its samples, in their order (module docstring).
    The trained tokens and per-token fields are in the order of the rows' samples, as `collate` of
    them gives them."""
    width = max(row_length(row) for row in rows)
    shape = (len(rows), width)
    input_ids = torch.full(shape, pad_id, dtype=torch.long)
    attention, mask = torch.zeros(shape, dtype=torch.long), torch.zeros(shape, dtype=torch.bool)
    positions = torch.zeros(shape, dtype=torch.long)
    subtree_end = torch.arange(1, width + 1).repeat(len(rows), 1)
    predict = []
    for r, row in enumerate(rows):
        n = row_length(row)
        ids, trained, parent, position = [0] * n, [False] * n, [-1] * n, [0] * n  # per column of the row
        filled = 0  # columns written by the row's earlier samples: a sample's lead in them is theirs
        for s, columns in zip(row, tree_columns(row)):
            size = prefix_length(s)
            for t in range(len(columns) - (columns[-1] + 1 - filled), len(columns)):  # its new columns
                column = columns[t]
                ids[column], position[column] = s.ids[t], t
                parent[column] = columns[t - 1] if t else -1
                trained[column] = t >= size and s.mask[t]
            # Token t of the sample is predicted at its token t - 1's column.
            predict += [r * width + columns[t - 1] for t in range(size, len(s.ids)) if s.mask[t]]
            filled = max(filled, columns[-1] + 1)
        end = list(range(1, n + 1))
        for column in range(n - 1, -1, -1):  # children after parents: a subtree ends where its last descendant does
            if parent[column] >= 0:
                end[parent[column]] = max(end[parent[column]], end[column])
        input_ids[r, :n], mask[r, :n] = torch.tensor(ids), torch.tensor(trained)
        positions[r, :n], subtree_end[r, :n] = torch.tensor(position), torch.tensor(end)
        attention[r, :n] = 1
    samples = [s for row in rows for s in row]
    return TokenBatch(input_ids, attention, mask, position_ids=positions, subtree_end=subtree_end,
                      predict=torch.tensor(predict, dtype=torch.long), **_fields(samples))


def prefix_rows(samples: list[TrainSample], max_row: int, pair_cost: float = 0.0) -> list[list[TrainSample]]:
    """Samples sorted by prefix (those with the same prefix in their given order), so that shared
    leading parts are neighbours, and placed into rows of at most `max_row` packed tokens in that
    order: a sample joins the last row when it fits and sharing pays for the row's longer
    attention (`Packing`), else starts a row. A sample longer than `max_row` gets a row of its own."""
    ordered = sorted(samples, key=lambda s: s.ids[:prefix_length(s)])
    rows: list[list[TrainSample]] = []
    used, previous = 0, []
    for s in ordered:
        prefix, n = s.ids[:prefix_length(s)], len(s.ids)
        extra = n - _shared(prefix, previous)
        grows = extra + pair_cost * ((used + extra) ** 2 - used ** 2)
        if rows and used + extra <= max_row and grows < n + pair_cost * n ** 2:
            rows[-1].append(s)
            used += extra
        else:
            rows.append([s])
            used = n
        previous = prefix
    return rows


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


def work(chunks: list[list], length: Callable, pair_cost: float) -> float:
    """The modelled work of micro-batches (`Packing`): each runs count x width positions and
    count x width^2 attention pairs, padding included."""
    total = 0.0
    for chunk in chunks:
        width = max(map(length, chunk))
        total += len(chunk) * width * (1 + pair_cost * width)
    return total


def packed_chunks(samples: list[TrainSample], max_row: int, token_budget: int, pack: Packing
                  ) -> list[list[list[TrainSample]]] | None:
    """Micro-batches of packed rows within `token_budget` padded tokens: of the rows that a sample
    joins when its sharing pays for the longer attention, and the rows that every sample sharing
    a leading token joins (fewer rows, less padding), the layout of least modelled work
    (`work`); None when one row per sample is modelled cheaper still."""
    layouts = [prefix_rows(samples, max_row, cost) for cost in dict.fromkeys((pack.pair_cost, 0.0))]
    lengths = {id(row): row_length(row) for rows in layouts for row in rows}

    def length(row):
        return lengths[id(row)]

    chunked = [list(budget_chunks(rows, token_budget, length)) for rows in layouts]
    cost, best = min(((work(chunks, length, pack.pair_cost), chunks) for chunks in chunked),
                     key=lambda pair: pair[0])
    plain = work(list(budget_chunks(samples, token_budget)), lambda s: len(s.ids), pack.pair_cost)
    return best if cost < plain else None


def _chunks(samples: list[TrainSample], token_budget: int, pad_id: int, pack: Packing | None
            ) -> list[tuple[list[TrainSample], TokenBatch]]:
    """(the samples of a micro-batch in its token order, the micro-batch) within `token_budget`
    padded tokens, longest rows first; with `pack`, samples sharing a prefix share rows where
    that is modelled cheaper (`packed_chunks`)."""
    chunks = None
    if pack is not None and samples:
        max_row = min(token_budget, max(ROW_TOKENS, 2 * max(len(s.ids) for s in samples)))
        chunks = packed_chunks(samples, max_row, token_budget, pack)
    if chunks is None:
        return [(chunk, collate(chunk, pad_id)) for chunk in budget_chunks(samples, token_budget)]
    return [([s for row in chunk for s in row], collate_rows(chunk, pad_id)) for chunk in chunks]


def micro_batches(samples: list[TrainSample], token_budget: int, pad_id: int = 0, pack: Packing | None = None
                  ) -> list[TokenBatch]:
    """Samples (longest first) in micro-batches of at most `token_budget` padded tokens, with
    `pack` each shared prefix computed once (see the module docstring)."""
    return [batch for _, batch in _chunks(samples, token_budget, pad_id, pack)]


def per_sample(samples: list[TrainSample], token_budget: int, pad_id: int,
               compute: Callable[[list[TokenBatch]], list[torch.Tensor]], pack: Packing | None = None
               ) -> list[torch.Tensor]:
    """`compute(batches)` -> one (N, ...) tensor per trained token of each batch, run on the
    samples in budget-sized micro-batches (packed with `pack`), split back into one tensor
    (n_targets, ...) per sample, in the order of `samples`."""
    chunks = _chunks(samples, token_budget, pad_id, pack)
    out: dict[int, torch.Tensor] = {}
    for (chunk, _), values in zip(chunks, compute([batch for _, batch in chunks])):
        for s, part in zip(chunk, values.split([s.n_targets for s in chunk])):
            out[id(s)] = part
    return [out[id(s)] for s in samples]
