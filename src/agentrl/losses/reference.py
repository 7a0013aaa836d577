"""The KL reference as components, built for every run whose `rl.kl_coef` > 0 (registered in
`COMPONENTS` as `kl_reference`, always on): the reference's log-probs of every trained token, and
the KL penalty as a reward term (`rl.kl_in_reward`)."""

from __future__ import annotations

import torch

from agentrl.components import Component, Context, StepBatch
from agentrl.forward import response_logprobs
from agentrl.models import load_model
from agentrl.packing import Packing, per_sample
from agentrl.registry import COMPONENTS, KL_ESTIMATORS


@COMPONENTS.register("kl_reference", always=True)
def kl_reference(_config: None, ctx: Context) -> list[Component]:
    """What the KL term needs (`rl.kl_coef` > 0): the reference's log-probs, and with
    `rl.kl_in_reward` the penalty in the reward; none without a KL term."""
    config, rl = ctx.config, ctx.config.rl
    if rl.kl_coef == 0:
        return []
    reference = None  # with LoRA: the policy with its adapters off
    if getattr(rl.actor, "lora", None) is None:
        reference = load_model(ctx.model_path, config.model.dtype).eval().requires_grad_(False)
    parts: list[Component] = [ReferenceLogprobs(reference, ctx.policy, config.sampling.temperature or 1.0,
                                                rl.micro_batch_tokens, ctx.tokenizer.pad_token_id, ctx.packing)]
    if rl.kl_in_reward:
        parts.append(KLRewardPenalty(rl.kl_coef, rl.kl_estimator))
    return parts


class ReferenceLogprobs(Component):
    """log p_ref of every trained token (`TrainSample.ref_logprobs`): the frozen initial model, or
    with LoRA the policy itself with its adapters switched off (no second copy)."""

    name = "ref"

    def __init__(self, reference, policy, temperature: float, token_budget: int, pad_id: int, pack: Packing | None = None):
        self.reference, self.policy = reference, policy
        self.temperature, self.token_budget, self.pad_id, self.pack = temperature, token_budget, pad_id, pack

    @torch.no_grad()
    def score(self, batch: StepBatch) -> None:
        def logprobs(tokens):
            if self.reference is not None:
                return response_logprobs(self.reference, tokens, self.temperature)[0]
            with self.policy.disable_adapter():
                return response_logprobs(self.policy, tokens, self.temperature)[0]

        found = per_sample(batch.samples, self.token_budget, self.pad_id, lambda batches: [logprobs(b) for b in batches],
                           self.pack)
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
