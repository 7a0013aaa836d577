"""Components: what attaches to the RL step beyond rollouts -> advantages -> policy loss.

The trainer calls every component's hooks at fixed points of a step, in order:

    hint(step)          text put before every training prompt of the step (prompt correction)
    score(batch)        after the rollouts, before the advantages: reference log-probs, reward
                        terms (the KL penalty), critic values
    shape(batch)        after the advantages, before the update: per-token reweighting (NTHR,
                        through `batch.scale_advantages`), measurements (the coupling lab)
    after_update(batch) after the actor's update (the critic's regression)

and, outside the step, `evaluate` (numbers added to each split's results), `parameters` (trained
by the actor's optimiser beside the model), `state` / `load_state` (JSON run state for
checkpoints) and `save` / `load` (tensors, in checkpoints/step_N/<name>/). Every hook is optional:
a component overrides the ones it needs. Auxiliary losses are components too; an estimator's
registry entry may bring its own (PPO's critic). A plugin adds one with a config class and a
builder `(config, context) -> Component` registered in `agentrl.registry.COMPONENTS`, used by
`rl.components: [{type: ...}]`. This module is the protocol only; the trainer assembles a run's
components (`trainer.build_components`).
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import torch

from agentrl.advantages.common import Advantages
from agentrl.packing import Packing, TrainSample
from agentrl.rollout.types import StepSample, Trajectory


@dataclass
class StepBatch:
    """One training step's data on this rank, as the hooks see it."""

    step: int
    trajectories: list[Trajectory]
    """The usable trajectories (groups with an aborted episode left out)."""
    steps: list[StepSample]
    """Their steps, in trajectory order."""
    samples: list[TrainSample]
    """One training sample per step, same order, with its per-token fields (old_logprobs from the
    start, ref_logprobs after the reference's `score`, advantages after the `shape` hooks)."""
    advantages: Advantages | None = None
    """The estimator's result (None before `shape`)."""
    token_scales: dict[int, list[float]] = field(default_factory=dict)
    """Multipliers of a sample's per-token advantages (by its place in `samples`) that `shape`
    hooks set through `scale_advantages` (e.g. NTHR's down-weighted negative tokens)."""
    metrics: dict[str, float] = field(default_factory=dict)
    """Namespaced metrics the hooks add (e.g. critic/value_loss)."""

    def set_advantages(self, advantages: Advantages) -> None:
        """The estimator's result, each step's advantage onto its step (`Advantages.values` holds
        each trajectory's steps in order)."""
        self.advantages = advantages
        flat = [a for values in advantages.values for a in values]
        for step, a in zip(self.steps, flat, strict=True):
            step.advantage = a

    def scale_advantages(self, index: int, weights: list[float]) -> None:
        """Multiply the per-token advantages of sample `index` by `weights` (one per trained token)."""
        old = self.token_scales.get(index, [1.0] * len(weights))
        self.token_scales[index] = [a * b for a, b in zip(old, weights, strict=True)]

    def attach_advantages(self) -> None:
        """Each step's advantage onto its sample's trained tokens, times the token scales: the one
        writer of `TrainSample.advantages`."""
        for i, (step, sample) in enumerate(zip(self.steps, self.samples, strict=True)):
            scales = self.token_scales.get(i, [1.0] * sample.n_targets)
            sample.advantages = [step.advantage * w for w in scales]


class Component:
    name = "component"

    def hint(self, step: int) -> str:
        return ""

    def score(self, batch: StepBatch) -> None:
        pass

    def shape(self, batch: StepBatch) -> None:
        pass

    def after_update(self, batch: StepBatch) -> None:
        pass

    def evaluate(self, trajectories: list[Trajectory], seed: int) -> dict[str, float]:
        return {}

    def parameters(self) -> list[torch.nn.Parameter]:
        return []

    def state(self) -> dict:
        return {}

    def load_state(self, state: dict) -> None:
        pass

    def save(self, path: Path) -> None:
        pass

    def load(self, path: Path) -> None:
        pass


@dataclass
class Context:
    """What a component builder may use."""

    config: object
    """The whole run config."""
    model_path: str
    policy: object
    """A full HF module with the actor's current weights (the actor's own, or the sampler's copy)."""
    sampler: object
    tokenizer: object
    run_dir: Path
    packing: Packing | None = None
    """How the run packs step samples for the model (`rl.pack_prefixes`; None: unpacked): pass it
    to `micro_batches` / `per_sample` when running the model on them."""


@contextmanager
def timed(timing: dict[str, float], key: str):
    start = time.perf_counter()
    yield
    timing[key] = timing.get(key, 0.0) + time.perf_counter() - start
