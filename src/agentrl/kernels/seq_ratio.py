"""Sequence-ratio PPO loss (GAGPO / GSPO) in one pass per action.

For action a with tokens t in a (contiguous), s_a = exp(mean_t (logp_t - old_t)), the clipped
objective L_a = max(-A_a s_a, -A_a clip(s_a, 1 - eps_low, 1 + eps_high)), dual-clipped to
-A_a c when A_a < 0; every token of the action carries L_a (as `losses.policy.seq_ratio` does).
Backward: dL_a / dlogp_t = L'_a(s_a) s_a / |a|, so a token's gradient is that times the sum of the
upstream gradients over the action's tokens. The forward also returns s_a (A,) for the clip counts.
The PyTorch reference is `agentrl.losses.policy.seq_ratio`.
"""

from __future__ import annotations

import torch

from agentrl.kernels.linear_logprob import triton

if triton is not None:
    import triton.language as tl

    @triton.jit
    def _forward_kernel(logp_ptr, old_ptr, adv_ptr, offsets_ptr, loss_ptr, ratio_ptr, coef_ptr,
                        low, high, dual, HAS_DUAL: tl.constexpr, BLOCK: tl.constexpr):
        a = tl.program_id(0)
        start, end = tl.load(offsets_ptr + a), tl.load(offsets_ptr + a + 1)
        total = tl.zeros((BLOCK,), tl.float32)
        for i in range(start, end, BLOCK):
            idx = i + tl.arange(0, BLOCK)
            keep = idx < end
            total += tl.load(logp_ptr + idx, mask=keep, other=0.0) - tl.load(old_ptr + idx, mask=keep, other=0.0)
        n = (end - start).to(tl.float32)
        ratio = tl.exp(tl.sum(total, 0) / n)
        adv = tl.load(adv_ptr + start)
        unclipped = -adv * ratio
        clipped = -adv * tl.minimum(tl.maximum(ratio, 1.0 - low), 1.0 + high)
        loss = tl.maximum(unclipped, clipped)
        inside = (ratio >= 1.0 - low) & (ratio <= 1.0 + high)
        slope = tl.where((unclipped >= clipped) | inside, -adv, 0.0)
        if HAS_DUAL:
            capped = (adv < 0) & (loss > -adv * dual)
            loss = tl.where(capped, -adv * dual, loss)
            slope = tl.where(capped, 0.0, slope)
        for i in range(start, end, BLOCK):
            idx = i + tl.arange(0, BLOCK)
            tl.store(loss_ptr + idx, tl.zeros((BLOCK,), tl.float32) + loss, mask=idx < end)
        tl.store(ratio_ptr + a, ratio)
        tl.store(coef_ptr + a, slope * ratio / n)

    @triton.jit
    def _backward_kernel(grad_ptr, offsets_ptr, coef_ptr, out_ptr, BLOCK: tl.constexpr):
        a = tl.program_id(0)
        start, end = tl.load(offsets_ptr + a), tl.load(offsets_ptr + a + 1)
        total = tl.zeros((BLOCK,), tl.float32)
        for i in range(start, end, BLOCK):
            idx = i + tl.arange(0, BLOCK)
            total += tl.load(grad_ptr + idx, mask=idx < end, other=0.0)
        value = tl.sum(total, 0) * tl.load(coef_ptr + a)
        for i in range(start, end, BLOCK):
            idx = i + tl.arange(0, BLOCK)
            tl.store(out_ptr + idx, tl.zeros((BLOCK,), tl.float32) + value, mask=idx < end)


BLOCK = 128


class _SeqRatio(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logp, old_logp, advantages, offsets, low, high, dual):
        n_actions = offsets.numel() - 1
        loss = torch.empty_like(logp, dtype=torch.float32)
        ratio = torch.empty(n_actions, dtype=torch.float32, device=logp.device)
        coef = torch.empty_like(ratio)
        _forward_kernel[(n_actions,)](logp.float().contiguous(), old_logp.float().contiguous(),
                                      advantages.float().contiguous(), offsets, loss, ratio, coef, low, high,
                                      dual or 0.0, HAS_DUAL=dual is not None, BLOCK=BLOCK)
        ctx.save_for_backward(offsets, coef)
        ctx.mark_non_differentiable(ratio)
        return loss, ratio

    @staticmethod
    def backward(ctx, grad_loss, grad_ratio):
        offsets, coef = ctx.saved_tensors
        grad = torch.empty_like(grad_loss, dtype=torch.float32)
        _backward_kernel[(offsets.numel() - 1,)](grad_loss.float().contiguous(), offsets, coef, grad, BLOCK=BLOCK)
        return grad, None, None, None, None, None, None


def seq_ratio_triton(logp, old_logp, advantages, segments, config):
    """Same contract as `losses.policy.seq_ratio`: per-token loss (N,) and clip counts. `segments`
    (N,) numbers each token's action; an action's tokens are contiguous (as in a micro-batch)."""
    if triton is None:
        raise RuntimeError("the Triton path needs `pip install triton` (CUDA, or CPU with TRITON_INTERPRET=1)")
    counts = torch.bincount(segments)
    offsets = torch.zeros(counts.numel() + 1, dtype=torch.int32, device=logp.device)
    offsets[1:] = torch.cumsum(counts, 0)
    loss, ratio = _SeqRatio.apply(logp, old_logp, advantages, offsets, config.clip_low, config.clip_high,
                                  config.dual_clip)
    with torch.no_grad():  # clip counts per token, as the PyTorch loss reports them
        adv = advantages[offsets[:-1].long()]
        clipped = -adv * torch.clamp(ratio, 1 - config.clip_low, 1 + config.clip_high)
        stats = {"pg_clipfrac": ((clipped > -adv * ratio).float() * counts).sum()}
        if config.dual_clip is not None:
            best = torch.maximum(-adv * ratio, clipped)
            stats["pg_clipfrac_dual"] = (((adv < 0) & (best > -adv * config.dual_clip)).float() * counts).sum()
    return loss, stats
