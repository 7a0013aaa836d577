"""The RL update's loss on one micro-batch, the sum of named parts (each a `LossOutputs`):

    policy    the registered policy loss (`rl.loss`) on the step's advantages, times the
              truncated importance weights where the old log-probs are the actor's (`rl.tis_cap`)
    kl        rl.kl_coef x KL(policy || reference), when the KL is not a reward term
    entropy   -rl.entropy_coef x the entropy (its value is always reported)
    check     on the update's first forward passes, which run the weights that sampled: the
              sampler-actor gap of the sampled tokens (no loss)

Each part weighs its per-token values by the batch's `weight` (`rl.loss_agg` over the whole
mini-batch, from `aggregation_weights`); each auxiliary loss (`losses/aux.py`) joins the same
optimiser step as a part of its own.
"""

from __future__ import annotations

import torch

from agentrl.actor.base import LossFn
from agentrl.losses.policy import k3
from agentrl.metrics import LossOutputs, Tally
from agentrl.packing import TokenBatch
from agentrl.registry import KL_ESTIMATORS, POLICY_LOSSES


def policy_part(logp: torch.Tensor, batch: TokenBatch, loss, config) -> LossOutputs:
    """`loss` (a registered policy loss with its `config`) on the batch's tokens; logp (N,)."""
    pg, counts = loss(logp, batch.old_logprobs, batch.advantages, batch.sample_index, config)
    if batch.is_weight is not None:  # truncated importance sampling (rl.tis_cap)
        pg = batch.is_weight * pg
    # kl_old: mean of log(old / new) per token; ~0 on the first mini-batch of an update, where the
    # actor must score the sampled tokens exactly as the sampler did.
    return LossOutputs((batch.weight * pg).sum(), per_token={
        "pg_loss": pg.sum().detach(), "kl_old": (batch.old_logprobs - logp).sum().detach(),
        **{k: c.detach() for k, c in counts.items()}})


def kl_part(logp: torch.Tensor, batch: TokenBatch, estimator, coef: float) -> LossOutputs:
    """coef x the per-token KL to the reference (`estimator` of KL_ESTIMATORS)."""
    kl = estimator(logp, batch.ref_logprobs)
    return LossOutputs(coef * (batch.weight * kl).sum(), per_token={"kl": kl.sum().detach()})


def entropy_part(entropy: torch.Tensor, batch: TokenBatch, coef: float) -> LossOutputs:
    """The entropy bonus: -coef x the per-token entropy (N,)."""
    loss = -coef * (batch.weight * entropy).sum() if coef else entropy.new_zeros(())
    return LossOutputs(loss, per_token={"entropy": entropy.sum().detach()})


def sampler_check(log_ratio: torch.Tensor) -> LossOutputs:
    """How far the actor's log-probs of the sampled tokens are from the sampler's (`log_ratio`,
    (N,): log p_actor - log p_sampler): other kernels, precision, a stale weight push.
    |log_ratio| summed and its largest value, and KL(sampler || actor) by k3 (the tokens were
    sampled from the sampler)."""
    log_ratio = log_ratio.detach().float()
    largest = {"check/diff_max": log_ratio.abs().max()} if len(log_ratio) else {}
    return LossOutputs(log_ratio.new_zeros(()), largest=largest, counts={
        "check/n": len(log_ratio), "check/diff": log_ratio.abs().sum(), "check/k3": k3(log_ratio).sum()})


def sampler_gap(tally: Tally) -> dict[str, float]:
    """The sampler check's numbers taken out of `tally` (every rank's), as the gap's metrics:
    mean and largest |log p_actor - log p_sampler| per sampled token and KL(sampler || actor)."""
    if "check/n" not in tally.counts:
        return {}
    n = max(tally.counts.pop("check/n"), 1)
    return {"rollout/logprob_diff_mean": tally.counts.pop("check/diff") / n,
            "rollout/logprob_diff_max": tally.largest.pop("check/diff_max", 0.0),
            "rollout/kl_sampler_actor": tally.counts.pop("check/k3") / n}


class StepLoss:
    """The policy's loss function for the RL settings `rl`, at the sampling `temperature`."""

    def __init__(self, rl, temperature: float):
        self.rl, self.temperature = rl, temperature
        self.policy = POLICY_LOSSES.get(rl.loss.type)
        self.kl = KL_ESTIMATORS.get(rl.kl_estimator) if rl.kl_coef > 0 and not rl.kl_in_reward else None

    def on(self, actor, check: bool = False) -> LossFn:
        """The loss of a micro-batch on `actor`; with `check` it also measures the sampler check
        (valid only before the step's first optimiser step)."""
        rl = self.rl

        def loss_fn(batch: TokenBatch) -> LossOutputs:
            logp, entropy = actor.token_logprobs(batch, self.temperature, entropy=True)  # (N,), (N,)
            out = policy_part(logp, batch, self.policy, rl.loss)
            if self.kl is not None:
                out = out + kl_part(logp, batch, self.kl, rl.kl_coef)
            out = out + entropy_part(entropy, batch, rl.entropy_coef)
            return out + sampler_check(logp - batch.old_logprobs) if check else out
        return loss_fn
