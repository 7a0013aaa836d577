"""Policy losses and KL estimators, registered by name (`agentrl.registry.POLICY_LOSSES`,
`KL_ESTIMATORS`): per-token log-probs -> per-token loss + clip counts.

A loss `(logp, old_logp, advantages, segments, config) -> (loss, counts)` returns *unreduced*
per-token values (all (N,) over response tokens; `segments` numbers each token's action); the
trainer weighs them by `aggregation_weights`, computed from the global token count, so the
update does not depend on how a batch is split into micro-batches or ranks.
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field

from agentrl.config import Section
from agentrl.kernels import use_triton
from agentrl.kernels.seq_ratio import seq_ratio_triton
from agentrl.registry import KL_ESTIMATORS, POLICY_LOSSES


class _ClipConfig(Section):
    clip_low: float = Field(0.2, ge=0)
    """Lower clip range: the ratio is kept above 1 - clip_low."""
    clip_high: float = Field(0.2, ge=0)
    """Upper clip range (0.28 for clip-higher)."""
    dual_clip: float | None = Field(3.0, gt=1)
    """Cap on the loss of negative-advantage tokens (None disables)."""


class PPOClipConfig(_ClipConfig):
    """Token-level PPO-clip."""

    type: Literal["ppo_clip"] = "ppo_clip"
    """Policy loss name in the registry."""


class SeqRatioConfig(_ClipConfig):
    """GAGPO / GSPO: one clipped ratio per action (mean token log-ratio, exponentiated)."""

    type: Literal["seq_ratio"] = "seq_ratio"
    """Policy loss name in the registry."""


def _clipped_objective(ratio, advantages, config):
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1 - config.clip_low, 1 + config.clip_high)
    loss = torch.maximum(unclipped, clipped)
    counts = {"pg_clipfrac": (clipped > unclipped).float().sum()}
    if config.dual_clip is not None:
        cap = -advantages * config.dual_clip
        dual = (advantages < 0) & (loss > cap)
        loss = torch.where(dual, cap, loss)
        counts["pg_clipfrac_dual"] = dual.float().sum()
    return loss, counts


@POLICY_LOSSES.register("ppo_clip", PPOClipConfig)
def ppo_clip(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, segments: torch.Tensor,
             config) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Token-level PPO-clip with optional dual clip. All inputs (N,) over response tokens."""
    return _clipped_objective(torch.exp(logp - old_logp), advantages, config)


@POLICY_LOSSES.register("seq_ratio", SeqRatioConfig)
def seq_ratio(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, segments: torch.Tensor,
              config) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Sequence-level ratio (GAGPO / GSPO): s = exp(mean over the action's tokens of the log-ratio),
    clipped like PPO; every token of the action carries s and the action's advantage.
    `segments` (N,) numbers the action of each token. On CUDA the Triton kernel computes the
    same in one pass (`agentrl.kernels.seq_ratio`)."""
    if segments.numel() and use_triton(logp):
        return seq_ratio_triton(logp, old_logp, advantages, segments, config)
    n = int(segments.max()) + 1 if segments.numel() else 0
    log_ratio = logp - old_logp
    sums = log_ratio.new_zeros(n).index_add(0, segments, log_ratio)
    counts = log_ratio.new_zeros(n).index_add(0, segments, torch.ones_like(log_ratio))
    ratio = torch.exp(sums / counts)[segments]  # (N,), one value per action
    return _clipped_objective(ratio, advantages, config)


def k3(log_ratio: torch.Tensor) -> torch.Tensor:
    """Schulman's k3 per token: r - 1 - log r with log r = log q(x) / p(x), an estimate of
    KL(p || q) from samples x of p (unbiased, never negative)."""
    return torch.exp(log_ratio) - log_ratio - 1


# Per-token estimators of KL(pi || ref) from samples of pi (Schulman, "Approximating KL").
def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """k3 of KL(pi || ref) ("low_var_kl"), clamped to +-10."""
    return torch.clamp(k3(torch.clamp(ref_logp - logp, -20, 20)), -10, 10)


def kl_k1(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """The log-ratio log pi - log ref per token (unbiased, high variance, can be negative)."""
    return logp - ref_logp


def kl_k2(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Half the squared log-ratio per token (biased, low variance)."""
    return 0.5 * (logp - ref_logp) ** 2


KL_ESTIMATORS.register("k1", target=kl_k1)
KL_ESTIMATORS.register("k2", target=kl_k2)
KL_ESTIMATORS.register("k3", target=kl_k3)


def aggregation_weights(lengths: list[int], mode: str, totals: tuple[float, float] | None = None) -> list[float]:
    """Per-sample token weight so that sum(weight * token loss) over a whole mini-batch is its
    aggregated loss; the weights use the global counts, so any micro-batch split sums the same.
    `totals` (tokens, sequences) of the whole mini-batch when `lengths` is one rank's share."""
    n_tokens, n_seqs = totals or (sum(lengths), len(lengths))
    if mode == "token-mean":
        return [1.0 / max(n_tokens, 1)] * len(lengths)
    if mode == "seq-mean-token-mean":
        return [1.0 / (max(n, 1) * n_seqs) for n in lengths]
    if mode == "seq-mean-token-sum":
        return [1.0 / n_seqs] * len(lengths)
    raise ValueError(f"unknown loss aggregation {mode!r}")
