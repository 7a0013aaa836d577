"""Fused linear log-prob + entropy: log p(target) and the entropy of softmax(h W^T / T) per row,
without materialising the (N, V) logits.

Memory: naive fp32 logits for N = 16k tokens at V = 151,936 take 16k * 152k * 4 B = 10 GB (and
the same again for their gradient). Here the forward keeps three (N,) vectors (log p, entropy,
log-sum-exp); the backward recomputes each (rows x vocabulary) tile from h and W.

With s = h W^T (N, V), z = s / T, p = softmax(z), target t:
  log p_t = z_t - lse(z),                 d log p_t / d s_j = (1[j = t] - p_j) / T
  H = lse(z) - sum_j p_j z_j,              d H / d s_j = -p_j (log p_j + H) / T
so with upstream gradients (g, e) per row, ds_j = (g (1[j = t] - p_j) - e p_j (log p_j + H)) / T,
dh = ds W and dW = ds^T h.

Two implementations share that arithmetic: a chunked PyTorch one (the CPU path and the test
oracle's neighbour) and Triton kernels (CUDA; on CPU only under TRITON_INTERPRET=1).
"""

from __future__ import annotations

import os

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # the PyTorch path needs no Triton
    triton = None

CHUNK_ROWS = 1024
"""Rows per chunk of the PyTorch path: peak extra memory is CHUNK_ROWS x V fp32 logits."""


# --- PyTorch path (chunked) ------------------------------------------------------------------
def _chunk_stats(h, weight, targets, temperature):
    z = (h @ weight.T).float() / temperature  # (C, V)
    lse = torch.logsumexp(z, -1)  # (C,)
    logp_all = z - lse[:, None]
    logp = logp_all.gather(-1, targets[:, None])[:, 0]
    entropy = -(logp_all.exp() * logp_all).sum(-1)
    return logp, entropy, logp_all


class _TorchLinearLogprob(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, targets, temperature):
        logps, entropies = [], []
        with torch.no_grad():
            for start in range(0, hidden.shape[0], CHUNK_ROWS):
                rows = slice(start, start + CHUNK_ROWS)
                logp, entropy, _ = _chunk_stats(hidden[rows], weight, targets[rows], temperature)
                logps.append(logp)
                entropies.append(entropy)
        logp, entropy = torch.cat(logps), torch.cat(entropies)
        ctx.save_for_backward(hidden, weight, targets, entropy)
        ctx.temperature = temperature
        return logp, entropy

    @staticmethod
    def backward(ctx, grad_logp, grad_entropy):
        hidden, weight, targets, entropy = ctx.saved_tensors
        grad_hidden = torch.zeros_like(hidden, dtype=torch.float32)
        grad_weight = torch.zeros_like(weight, dtype=torch.float32)
        for start in range(0, hidden.shape[0], CHUNK_ROWS):
            rows = slice(start, start + CHUNK_ROWS)
            h = hidden[rows]
            _, _, logp_all = _chunk_stats(h, weight, targets[rows], ctx.temperature)
            p = logp_all.exp()
            ds = -grad_logp[rows, None] * p - grad_entropy[rows, None] * p * (logp_all + entropy[rows, None])
            ds.scatter_add_(-1, targets[rows, None], grad_logp[rows, None].float())
            ds /= ctx.temperature
            grad_hidden[rows] = ds @ weight.float()
            grad_weight += ds.T @ h.float()
        return grad_hidden.to(hidden.dtype), grad_weight.to(weight.dtype), None, None


def linear_logprob_torch(hidden, weight, targets, temperature: float = 1.0):
    """(log p(target), entropy), each (N,) fp32, from hidden (N, H), weight (V, H), targets (N,)."""
    return _TorchLinearLogprob.apply(hidden, weight, targets, temperature)


# --- Triton path -----------------------------------------------------------------------------
if triton is not None:
    @triton.jit
    def _tile_logits(h_ptr, w_ptr, rows, cols, n_rows, n_cols, H, inv_t, BLOCK_N: tl.constexpr,
                     BLOCK_V: tl.constexpr, BLOCK_H: tl.constexpr, UPCAST: tl.constexpr):
        """z = (h[rows] @ w[cols]^T) / T for one (BLOCK_N, BLOCK_V) tile, fp32; padding -inf."""
        acc = tl.zeros((BLOCK_N, BLOCK_V), dtype=tl.float32)
        for k in range(0, H, BLOCK_H):
            ks = k + tl.arange(0, BLOCK_H)
            h = tl.load(h_ptr + rows[:, None] * H + ks[None, :], mask=(rows[:, None] < n_rows) & (ks[None, :] < H), other=0.0)
            w = tl.load(w_ptr + cols[:, None] * H + ks[None, :], mask=(cols[:, None] < n_cols) & (ks[None, :] < H), other=0.0)
            if UPCAST:
                h, w = h.to(tl.float32), w.to(tl.float32)
            acc = tl.dot(h, tl.trans(w), acc, out_dtype=tl.float32)
        z = acc * inv_t
        return tl.where(cols[None, :] < n_cols, z, float("-inf"))

    @triton.jit
    def _forward_kernel(h_ptr, w_ptr, t_ptr, logp_ptr, ent_ptr, lse_ptr, N, V, H, inv_t,
                        BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_H: tl.constexpr, UPCAST: tl.constexpr):
        # One program per BLOCK_N rows; online log-sum-exp over vocabulary tiles: running max m,
        # l = sum exp(z - m) and a = sum exp(z - m) z (for the entropy), and the target's logit.
        rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        targets = tl.load(t_ptr + rows, mask=rows < N, other=0)
        m = tl.full((BLOCK_N,), float("-inf"), tl.float32)
        l = tl.zeros((BLOCK_N,), tl.float32)
        a = tl.zeros((BLOCK_N,), tl.float32)
        z_target = tl.zeros((BLOCK_N,), tl.float32)
        for v in range(0, V, BLOCK_V):
            cols = v + tl.arange(0, BLOCK_V)
            z = _tile_logits(h_ptr, w_ptr, rows, cols, N, V, H, inv_t, BLOCK_N, BLOCK_V, BLOCK_H, UPCAST)
            m_new = tl.maximum(m, tl.max(z, 1))
            scale = tl.exp(m - m_new)
            e = tl.exp(z - m_new[:, None])
            l = l * scale + tl.sum(e, 1)
            a = a * scale + tl.sum(e * tl.where(cols[None, :] < V, z, 0.0), 1)
            z_target += tl.sum(tl.where(cols[None, :] == targets[:, None], z, 0.0), 1)
            m = m_new
        lse = m + tl.log(l)
        tl.store(logp_ptr + rows, z_target - lse, mask=rows < N)
        tl.store(ent_ptr + rows, lse - a / l, mask=rows < N)
        tl.store(lse_ptr + rows, lse, mask=rows < N)

    @triton.jit
    def _grad_logits(h_ptr, w_ptr, t_ptr, g_ptr, e_ptr, ent_ptr, lse_ptr, rows, cols, N, V, H, inv_t,
                     BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_H: tl.constexpr, UPCAST: tl.constexpr):
        """ds for one tile (see the module docstring); zero on padding."""
        z = _tile_logits(h_ptr, w_ptr, rows, cols, N, V, H, inv_t, BLOCK_N, BLOCK_V, BLOCK_H, UPCAST)
        live = rows < N
        targets = tl.load(t_ptr + rows, mask=live, other=-1)
        g = tl.load(g_ptr + rows, mask=live, other=0.0)
        e = tl.load(e_ptr + rows, mask=live, other=0.0)
        ent = tl.load(ent_ptr + rows, mask=live, other=0.0)
        lse = tl.load(lse_ptr + rows, mask=live, other=0.0)
        logp = z - lse[:, None]
        p = tl.where(cols[None, :] < V, tl.exp(logp), 0.0)
        logp = tl.where(cols[None, :] < V, logp, 0.0)
        ds = -g[:, None] * p - e[:, None] * p * (logp + ent[:, None])
        ds += tl.where(cols[None, :] == targets[:, None], g[:, None], 0.0)
        return ds * inv_t

    @triton.jit
    def _grad_hidden_kernel(h_ptr, w_ptr, t_ptr, g_ptr, e_ptr, ent_ptr, lse_ptr, dh_ptr, N, V, H, inv_t,
                            BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_H: tl.constexpr, UPCAST: tl.constexpr):
        # One program per row block owns dh[rows]: no atomics, deterministic.
        rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        for v in range(0, V, BLOCK_V):
            cols = v + tl.arange(0, BLOCK_V)
            ds = _grad_logits(h_ptr, w_ptr, t_ptr, g_ptr, e_ptr, ent_ptr, lse_ptr, rows, cols, N, V, H, inv_t,
                              BLOCK_N, BLOCK_V, BLOCK_H, UPCAST)
            for k in range(0, H, BLOCK_H):
                ks = k + tl.arange(0, BLOCK_H)
                w = tl.load(w_ptr + cols[:, None] * H + ks[None, :], mask=(cols[:, None] < V) & (ks[None, :] < H), other=0.0)
                out = dh_ptr + rows[:, None] * H + ks[None, :]
                keep = (rows[:, None] < N) & (ks[None, :] < H)
                tl.store(out, tl.load(out, mask=keep, other=0.0) + tl.dot(ds, w.to(tl.float32)), mask=keep)

    @triton.jit
    def _grad_weight_kernel(h_ptr, w_ptr, t_ptr, g_ptr, e_ptr, ent_ptr, lse_ptr, dw_ptr, N, V, H, inv_t,
                            BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_H: tl.constexpr, UPCAST: tl.constexpr):
        # One program per vocabulary tile owns dW[cols]; loops over all row blocks.
        cols = tl.program_id(0) * BLOCK_V + tl.arange(0, BLOCK_V)
        for n in range(0, N, BLOCK_N):
            rows = n + tl.arange(0, BLOCK_N)
            ds = _grad_logits(h_ptr, w_ptr, t_ptr, g_ptr, e_ptr, ent_ptr, lse_ptr, rows, cols, N, V, H, inv_t,
                              BLOCK_N, BLOCK_V, BLOCK_H, UPCAST)
            for k in range(0, H, BLOCK_H):
                ks = k + tl.arange(0, BLOCK_H)
                h = tl.load(h_ptr + rows[:, None] * H + ks[None, :], mask=(rows[:, None] < N) & (ks[None, :] < H), other=0.0)
                out = dw_ptr + cols[:, None] * H + ks[None, :]
                keep = (cols[:, None] < V) & (ks[None, :] < H)
                tl.store(out, tl.load(out, mask=keep, other=0.0) + tl.dot(tl.trans(ds), h.to(tl.float32)), mask=keep)


BLOCKS = {"BLOCK_N": 16, "BLOCK_V": 64, "BLOCK_H": 32}
"""Tile sizes (tl.dot needs >= 16 per dimension). Chosen for correctness on the interpreter;
autotuning for a given GPU is future work."""


def _meta() -> dict:
    # Triton 3.7.1's CPU interpreter computes bf16 tl.dot wrongly: upcast the tiles there only.
    return {**BLOCKS, "UPCAST": os.environ.get("TRITON_INTERPRET") == "1"}


class _TritonLinearLogprob(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, targets, temperature):
        hidden, weight, targets = hidden.contiguous(), weight.contiguous(), targets.contiguous()
        (N, H), V = hidden.shape, weight.shape[0]
        logp, entropy, lse = (torch.empty(N, dtype=torch.float32, device=hidden.device) for _ in range(3))
        grid = (triton.cdiv(N, BLOCKS["BLOCK_N"]),)
        _forward_kernel[grid](hidden, weight, targets, logp, entropy, lse, N, V, H, 1.0 / temperature, **_meta())
        ctx.save_for_backward(hidden, weight, targets, entropy, lse)
        ctx.temperature = temperature
        return logp, entropy

    @staticmethod
    def backward(ctx, grad_logp, grad_entropy):
        hidden, weight, targets, entropy, lse = ctx.saved_tensors
        (N, H), V = hidden.shape, weight.shape[0]
        g, e = grad_logp.float().contiguous(), grad_entropy.float().contiguous()
        dh = torch.zeros(N, H, dtype=torch.float32, device=hidden.device)
        dw = torch.zeros(V, H, dtype=torch.float32, device=hidden.device)
        args = (hidden, weight, targets, g, e, entropy, lse)
        _grad_hidden_kernel[(triton.cdiv(N, BLOCKS["BLOCK_N"]),)](*args, dh, N, V, H, 1.0 / ctx.temperature, **_meta())
        _grad_weight_kernel[(triton.cdiv(V, BLOCKS["BLOCK_V"]),)](*args, dw, N, V, H, 1.0 / ctx.temperature, **_meta())
        return dh.to(hidden.dtype), dw.to(weight.dtype), None, None


def linear_logprob_triton(hidden, weight, targets, temperature: float = 1.0):
    if triton is None:
        raise RuntimeError("the Triton path needs `pip install triton` (CUDA, or CPU with TRITON_INTERPRET=1)")
    return _TritonLinearLogprob.apply(hidden, weight, targets, temperature)
