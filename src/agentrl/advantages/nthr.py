"""NTHR (Deng et al., arXiv 2505.18830): down-weight the penalty on the negative-sample tokens
that are most coupled to the positive samples of their group. A modifier on top of any
estimator (`rl.components: [{type: nthr}]`), applied to the per-token advantages before the update.

What is implemented, exactly. Within each task group, positive tokens P are the response tokens
of step samples with A > 0 and negative tokens N those with A < 0. For a token i with final
hidden state h_i (the lm_head's input at the position that predicts it) and prediction error
e_i = onehot(y_i) - softmax(W h_i / T), the gradient of log p(y_i) with respect to the lm_head W
is e_i h_i^T / T, so a gradient step on token i changes log p(y_j) to first order in proportion to

    k(i, j) = <e_i, e_j> * <h_i, h_j>       (the last layer's gradient inner product).

The score of a negative token is its coupling to the positive set, s_k = sum_{j in P} k(k, j): a
large s_k means that pushing token k down also pushes the positive responses down (the "lazy
likelihood displacement" of the paper). The reference level is the positive tokens' own
coupling, m = mean_{i in P} sum_{j in P} k(i, j). Negative tokens with s_k > tau * m have their
advantage multiplied by eta (0 <= eta < 1); all other tokens are untouched. Groups without both
positive and negative samples are untouched. The paper selects tokens by this kind of score
against correct responses; tau and eta are this implementation's knobs (defaults 1.0 and 0.5).
"""

from __future__ import annotations

from typing import ClassVar, Literal

import torch
from pydantic import Field

from agentrl.components import Component, Context, StepBatch
from agentrl.config import Section
from agentrl.forward import trained_hidden
from agentrl.packing import Packing, per_sample
from agentrl.registry import COMPONENTS


class NTHRConfig(Section):
    """NTHR: scale by `eta` the advantage of negative-sample tokens whose last-layer gradient
    coupling to the group's positive tokens exceeds `tau` x the positives' own mean coupling
    (exact definition: agentrl/advantages/nthr.py)."""

    type: Literal["nthr"] = "nthr"
    """Component name in the registry."""
    tau: float = 1.0
    """Coupling threshold, relative to the positive tokens' own mean coupling."""
    eta: float = Field(0.5, ge=0, le=1)
    """Multiplier of the advantage of negative tokens above the threshold."""
    reads_policy: ClassVar[bool] = True  # the last layer of a full HF copy of the policy


def coupling(h_a, y_a, p_a, h_b, y_b, p_b) -> torch.Tensor:
    """k(a, b) (Na, Nb) = <e_a, e_b> <h_a, h_b> without materialising the error vectors' outer
    products: <e_a, e_b> = [y_a = y_b] - p_a[y_b] - p_b[y_a] + <p_a, p_b>."""
    errors = ((y_a[:, None] == y_b[None, :]).to(h_a.dtype) - p_a[:, y_b] - p_b[:, y_a].T + p_a @ p_b.T)
    return errors * (h_a @ h_b.T)


def nthr_token_weights(h_pos, y_pos, h_neg, y_neg, head_weight, temperature: float, tau: float,
                       eta: float) -> torch.Tensor:
    """Multipliers (Nn,) for the negative tokens' advantages."""
    p_pos = torch.softmax(h_pos @ head_weight.T / temperature, -1)
    p_neg = torch.softmax(h_neg @ head_weight.T / temperature, -1)
    reference = coupling(h_pos, y_pos, p_pos, h_pos, y_pos, p_pos).sum(1).mean()
    scores = coupling(h_neg, y_neg, p_neg, h_pos, y_pos, p_pos).sum(1)
    return torch.where(scores > tau * reference, torch.full_like(scores, eta), torch.ones_like(scores))


@torch.no_grad()
def token_hidden(model, samples, pad_id: int, token_budget: int, pack: Packing | None = None
                 ) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(hidden (n, H), targets (n,)) of every sample's trained tokens, in the samples' order."""
    hidden = per_sample(samples, token_budget, pad_id, lambda batches: [trained_hidden(model, b).float() for b in batches],
                        pack)
    return [(h, torch.tensor(s.ids)[1:][torch.tensor(s.mask)[1:]].to(h.device)) for h, s in zip(hidden, samples)]


def nthr_scales(model, samples, advantages: list[float], group_ids: list[int], config, temperature: float,
                pad_id: int, token_budget: int, pack: Packing | None = None
                ) -> tuple[dict[int, list[float]], dict[str, float]]:
    """The per-token multipliers of the negative samples' advantages (by the sample's place in
    `samples`; the others are untouched) and the step's nthr/* metrics. `advantages` are the
    samples' step advantages."""
    features = token_hidden(model, samples, pad_id, token_budget, pack)
    head = model.get_output_embeddings().weight.detach().float()
    groups: dict[int, list[int]] = {}
    for i, g in enumerate(group_ids):
        groups.setdefault(g, []).append(i)
    scales: dict[int, list[float]] = {}
    for members in groups.values():
        pos = [i for i in members if advantages[i] > 0]
        neg = [i for i in members if advantages[i] < 0]
        if not pos or not neg:
            continue
        h_pos = torch.cat([features[i][0] for i in pos])
        y_pos = torch.cat([features[i][1] for i in pos])
        weights = nthr_token_weights(h_pos, y_pos, torch.cat([features[i][0] for i in neg]),
                                     torch.cat([features[i][1] for i in neg]), head, temperature,
                                     config.tau, config.eta).tolist()
        offset = 0
        for i in neg:
            n = samples[i].n_targets
            scales[i], offset = weights[offset:offset + n], offset + n
    negative_tokens = sum(len(w) for w in scales.values())
    downweighted = sum(x != 1.0 for w in scales.values() for x in w)
    return scales, {"nthr/negative_tokens": float(negative_tokens),
                    "nthr/downweighted_share": downweighted / negative_tokens if negative_tokens else 0.0}


@COMPONENTS.register("nthr", NTHRConfig)
class NTHR(Component):
    """NTHR in the step: after the advantages, before the update."""

    name = "nthr"

    def __init__(self, config: NTHRConfig, ctx: Context):
        self.policy, self.config, self.pack = ctx.policy, config, ctx.packing
        self.temperature = ctx.config.sampling.temperature or 1.0
        self.pad_id, self.token_budget = ctx.tokenizer.pad_token_id, ctx.config.rl.micro_batch_tokens

    def shape(self, batch: StepBatch) -> None:
        group_ids = [t.group_id for t in batch.trajectories for _ in t.steps]
        scales, metrics = nthr_scales(self.policy, batch.samples, [s.advantage for s in batch.steps], group_ids,
                                      self.config, self.temperature, self.pad_id, self.token_budget, self.pack)
        for i, weights in scales.items():
            batch.scale_advantages(i, weights)
        batch.metrics.update(metrics)
