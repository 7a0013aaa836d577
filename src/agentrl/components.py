"""Components: what attaches to the RL step beyond rollouts -> advantages -> policy loss.

The trainer calls every component's hooks at fixed points of a step, in order:

    hint(step)          text put before every training prompt of the step (prompt correction)
    score(batch)        after the rollouts, before the advantages: reference log-probs, reward
                        terms (the KL penalty), critic values
    shape(batch)        after the advantages, before the update: per-token reweighting (NTHR),
                        measurements (the coupling lab)
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
    start, ref_logprobs after the reference's `score`, advantages before `shape`)."""
    advantages: Advantages | None = None
    """The estimator's result (None before `shape`)."""
    metrics: dict[str, float] = field(default_factory=dict)
    """Namespaced metrics the hooks add (e.g. critic/value_loss)."""

    def set_advantages(self, advantages: Advantages) -> None:
        """The estimator's result, each step's advantage onto the step and its sample's tokens
        (their one writer; `Advantages.values` holds each trajectory's steps in order)."""
        self.advantages = advantages
        flat = [a for values in advantages.values for a in values]
        for step, sample, a in zip(self.steps, self.samples, flat, strict=True):
            step.advantage = a
            sample.advantages = [a] * sample.n_targets


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
