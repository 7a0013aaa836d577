"""What an update reports: each micro-batch's loss with its metrics (`LossOutputs`), and their
`Tally` over an update's micro-batches, optimiser steps and ranks, each number reduced the way
its kind says (never by its name)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from agentrl import distributed

Values = dict[str, torch.Tensor | float]
KINDS = ("per_token", "per_update", "counts", "largest")


@dataclass
class LossOutputs:
    """One micro-batch's loss and its metrics, grouped by how each reduces over an update."""

    loss: torch.Tensor
    per_token: Values = field(default_factory=dict)
    """Sums over the batch's trained tokens, reported per trained token of the update (the
    policy loss, the entropy, clip counts)."""
    per_update: Values = field(default_factory=dict)
    """Already normalised over the optimiser step, reported as the mean over the update's
    optimiser steps (an auxiliary loss, the learning rate, the gradient norm)."""
    counts: Values = field(default_factory=dict)
    """Sums reported as they are (skipped updates, the sampler check's token count)."""
    largest: Values = field(default_factory=dict)
    """Reported as the largest value seen (the sampler-actor gap's maximum)."""

    def __add__(self, other: LossOutputs) -> LossOutputs:
        """Both losses summed, their metrics side by side (parts name distinct metrics)."""
        return LossOutputs(self.loss + other.loss, **{kind: getattr(self, kind) | getattr(other, kind)
                                                      for kind in KINDS})



@dataclass
class Tally:
    """The metrics of micro-batches (`add`) and ranks (`over_ranks`), plain floats by kind."""

    per_token: dict[str, float] = field(default_factory=dict)
    per_update: dict[str, float] = field(default_factory=dict)
    counts: dict[str, float] = field(default_factory=dict)
    largest: dict[str, float] = field(default_factory=dict)

    def add(self, other: LossOutputs | Tally) -> Tally:
        for kind in KINDS:
            mine = getattr(self, kind)
            for key, value in getattr(other, kind).items():
                value = float(value)
                mine[key] = max(mine.get(key, value), value) if kind == "largest" else mine.get(key, 0.0) + value
        return self

    def over_ranks(self) -> Tally:
        """The tally of every rank (each calls it): sums summed, maxima the maximum; a metric
        some rank lacks (it had nothing to train) counts there as 0, or as no maximum."""
        names = distributed.union([f"{kind}/{key}" for kind in KINDS for key in getattr(self, kind)])
        total = Tally()
        sums = [name.split("/", 1) for name in names if not name.startswith("largest/")]
        found = distributed.all_sum([getattr(self, kind).get(key, 0.0) for kind, key in sums])
        for (kind, key), value in zip(sums, found):
            getattr(total, kind)[key] = value
        for key in (name.removeprefix("largest/") for name in names if name.startswith("largest/")):
            total.largest[key] = distributed.all_max(self.largest.get(key, float("-inf")))
        return total

    def report(self, n_tokens: float, n_updates: int) -> dict[str, float]:
        """One float per metric: per-token sums over `n_tokens`, per-update values over
        `n_updates`, counts and maxima as they are."""
        return ({k: v / max(n_tokens, 1) for k, v in self.per_token.items()}
                | {k: v / max(n_updates, 1) for k, v in self.per_update.items()} | self.counts | self.largest)

