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
`rl.components: [{type: ...}]`.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import torch

from agentrl.actor.batch import TrainSample, per_sample
from agentrl.actor.single import response_logprobs
from agentrl.advantages import Advantages
from agentrl.registry import ADVANTAGES, AUX_LOSSES, COMPONENTS, KL_ESTIMATORS
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


@contextmanager
def timed(timing: dict[str, float], key: str):
    start = time.perf_counter()
    yield
    timing[key] = timing.get(key, 0.0) + time.perf_counter() - start


class ReferenceLogprobs(Component):
    """log p_ref of every trained token (`TrainSample.ref_logprobs`): the frozen initial model, or
    with LoRA the policy itself with its adapters switched off (no second copy)."""

    name = "ref"

    def __init__(self, reference, policy, temperature: float, token_budget: int, pad_id: int):
        self.reference, self.policy = reference, policy
        self.temperature, self.token_budget, self.pad_id = temperature, token_budget, pad_id

    @torch.no_grad()
    def score(self, batch: StepBatch) -> None:
        def logprobs(tokens):
            if self.reference is not None:
                return response_logprobs(self.reference, tokens, self.temperature)[0]
            with self.policy.disable_adapter():
                return response_logprobs(self.policy, tokens, self.temperature)[0]

        found = per_sample(batch.samples, self.token_budget, self.pad_id, lambda batches: [logprobs(b) for b in batches])
        for s, logp in zip(batch.samples, found):
            s.ref_logprobs = logp.tolist()


class KLRewardPenalty(Component):
    """KL(sampler || reference) as a reward term: kl_coef x the action's summed per-token KL joins
    its step's penalty before the advantages (after ReferenceLogprobs)."""

    name = "kl_penalty"

    def __init__(self, coef: float, estimator: str):
        self.coef, self.kl = coef, KL_ESTIMATORS.get(estimator)

    def score(self, batch: StepBatch) -> None:
        penalties = [self.coef * self.kl(torch.tensor(s.old_logprobs), torch.tensor(s.ref_logprobs)).sum().item()
                     for s in batch.samples]
        for step, penalty in zip(batch.steps, penalties):
            step.penalty += penalty
        batch.metrics["rollout/kl_penalty"] = sum(penalties) / len(penalties) if penalties else 0.0


def build_components(ctx: Context) -> tuple[list[Component], list]:
    """The run's components, in hook order: the reference and the KL penalty, those the
    estimator brings, NTHR, the coupling lab, the plugins' (`rl.components`), then the auxiliary
    losses (also returned apart: their losses join the update)."""
    from agentrl.advantages.nthr import NTHR
    from agentrl.analysis.coupling import CouplingLab
    from agentrl.models import load_model

    rl, config = ctx.config.rl, ctx.config
    temperature = config.sampling.temperature or 1.0
    components: list[Component] = []
    if rl.kl_coef > 0:
        reference = None
        if getattr(rl.actor, "lora", None) is None:
            reference = load_model(ctx.model_path, config.model.dtype).eval().requires_grad_(False)
        components.append(ReferenceLogprobs(reference, ctx.policy, temperature, rl.micro_batch_tokens,
                                            ctx.tokenizer.pad_token_id))
        if rl.kl_in_reward:
            components.append(KLRewardPenalty(rl.kl_coef, rl.kl_estimator))
    extra = ADVANTAGES.entry(rl.advantage.type).components
    if extra is not None:
        components += extra(rl.advantage, ctx)
    if rl.nthr is not None:
        components.append(NTHR(ctx.policy, rl.nthr, temperature, ctx.tokenizer.pad_token_id, rl.micro_batch_tokens))
    if rl.coupling_every:
        components.append(CouplingLab(ctx.policy, ctx.tokenizer, rl.coupling_every, rl.coupling_pairs,
                                      rl.coupling_lr, config.seed))
    components += [COMPONENTS.get(c.type)(c, ctx) for c in rl.components]
    aux_losses = [AUX_LOSSES.get(aux.type)(aux, ctx) for aux in rl.aux]
    names = [c.name for c in components + aux_losses]
    if len(set(names)) < len(names):
        raise ValueError(f"trainer components need distinct names (their metrics and checkpoint folders): {names}")
    return components + aux_losses, aux_losses
