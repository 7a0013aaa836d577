"""Policy losses, registered by name: per-token log-probs -> per-token loss + clip counts.

A loss returns *unreduced* per-token values; `aggregate` divides by the global token count, so
the update does not depend on how a batch is split into micro-batches or ranks.
"""

from __future__ import annotations

from typing import Callable

import torch

POLICY_LOSSES: dict[str, Callable] = {}


def register(name: str):
    def wrap(fn):
        POLICY_LOSSES[name] = fn
        return fn
    return wrap


@register("ppo_clip")
def ppo_clip(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, config
             ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Token-level PPO-clip with optional dual clip. All inputs (N,) over response tokens."""
    ratio = torch.exp(logp - old_logp)
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


def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Schulman's k3 estimator of KL(pi || ref) per token ("low_var_kl"), clamped to +-10."""
    log_ratio = torch.clamp(ref_logp - logp, -20, 20)
    return torch.clamp(torch.exp(log_ratio) - log_ratio - 1, -10, 10)
