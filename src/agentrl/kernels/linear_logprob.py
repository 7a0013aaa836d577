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
# Forward: one fused kernel, an online log-sum-exp over vocabulary tiles; the vocabulary may be
# split over several programs per row block (for parallelism when N is small), their partial
# statistics are merged in PyTorch (a few (S, N) vectors). Backward: row chunks; each chunk's
# logits are recomputed by one matmul, a Triton kernel turns them into ds in place, and two
# matmuls give dh and dW (cuBLAS on a GPU). Peak extra memory is one chunk of logits.
if triton is not None:
    @triton.jit
    def _forward_kernel(h_ptr, w_ptr, t_ptr, m_ptr, l_ptr, a_ptr, zt_ptr, N, V, H, inv_t, split_len,
                        BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_H: tl.constexpr,
                        UPCAST: tl.constexpr, PRECISION: tl.constexpr):
        # Program (row block, vocabulary split): running max m, l = sum exp(z - m),
        # a = sum exp(z - m) z (for the entropy) and the target's logit, over its vocabulary range.
        rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        split = tl.program_id(1)
        targets = tl.load(t_ptr + rows, mask=rows < N, other=0)
        m = tl.full((BLOCK_N,), float("-inf"), tl.float32)
        l = tl.zeros((BLOCK_N,), tl.float32)
        a = tl.zeros((BLOCK_N,), tl.float32)
        z_target = tl.zeros((BLOCK_N,), tl.float32)
        v_end = tl.minimum(V, (split + 1) * split_len)
        for v in range(split * split_len, v_end, BLOCK_V):
            cols = v + tl.arange(0, BLOCK_V)
            acc = tl.zeros((BLOCK_N, BLOCK_V), dtype=tl.float32)
            for k in range(0, H, BLOCK_H):
                ks = k + tl.arange(0, BLOCK_H)
                h = tl.load(h_ptr + rows[:, None] * H + ks[None, :], mask=(rows[:, None] < N) & (ks[None, :] < H),
                            other=0.0)
                w = tl.load(w_ptr + cols[:, None] * H + ks[None, :], mask=(cols[:, None] < v_end) & (ks[None, :] < H),
                            other=0.0)
                if UPCAST:
                    h, w = h.to(tl.float32), w.to(tl.float32)
                acc = tl.dot(h, tl.trans(w), acc, input_precision=PRECISION, out_dtype=tl.float32)
            live = cols[None, :] < v_end
            z = tl.where(live, acc * inv_t, float("-inf"))
            m_new = tl.maximum(m, tl.max(z, 1))
            scale = tl.exp(m - m_new)
            e = tl.exp(z - m_new[:, None])
            l = l * scale + tl.sum(e, 1)
            a = a * scale + tl.sum(e * tl.where(live, z, 0.0), 1)
            z_target += tl.sum(tl.where(cols[None, :] == targets[:, None], z, 0.0), 1)
            m = m_new
        out = split * N + rows
        tl.store(m_ptr + out, m, mask=rows < N)
        tl.store(l_ptr + out, l, mask=rows < N)
        tl.store(a_ptr + out, a, mask=rows < N)
        tl.store(zt_ptr + out, z_target, mask=rows < N)

    @triton.jit
    def _logits_to_grad_kernel(s_ptr, t_ptr, g_ptr, e_ptr, ent_ptr, lse_ptr, V, inv_t, BLOCK_V: tl.constexpr):
        # In place, one row and BLOCK_V columns per program: s = h W^T becomes ds (module docstring).
        row = tl.program_id(0)
        cols = tl.program_id(1) * BLOCK_V + tl.arange(0, BLOCK_V)
        ptrs = s_ptr + row.to(tl.int64) * V + cols
        z = tl.load(ptrs, mask=cols < V, other=0.0).to(tl.float32) * inv_t
        g, e = tl.load(g_ptr + row), tl.load(e_ptr + row)
        logp = z - tl.load(lse_ptr + row)
        p = tl.exp(logp)
        ds = -g * p - e * p * (logp + tl.load(ent_ptr + row))
        ds += tl.where(cols == tl.load(t_ptr + row), g, 0.0)
        tl.store(ptrs, (ds * inv_t).to(s_ptr.dtype.element_ty), mask=cols < V)


GPU_BLOCKS = {"BLOCK_N": 128, "BLOCK_V": 256, "BLOCK_H": 64, "num_warps": 8, "num_stages": 3}
INTERPRETER_BLOCKS = {"BLOCK_N": 16, "BLOCK_V": 32, "BLOCK_H": 16}
"""Forward tile sizes (tl.dot needs >= 16 per dimension). The GPU's are the best of nine measured
on an H100 (N = 2k/16k, H = 1536/3584, V = 151,936, bf16; 147 KB of shared memory: Hopper or an
A100). The interpreter's are small so that the tests' odd shapes cross several tiles and
vocabulary splits."""
GRAD_BLOCK_V = 1024
BACKWARD_CHUNK_BYTES = 1 << 30
"""Backward row chunk: as many rows as fit this many bytes of logits (at least 256 rows)."""


def _interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def _forward_launch(hidden, weight) -> tuple[dict, int]:
    """Kernel meta-parameters and the number of vocabulary splits per row block."""
    (N, _), V = hidden.shape, weight.shape[0]
    blocks = INTERPRETER_BLOCKS if _interpreted() else GPU_BLOCKS
    # Triton 3.7.1's CPU interpreter computes bf16 tl.dot wrongly: upcast the tiles there only.
    # fp32 inputs get fp32 products (tl.dot's default is TF32 on a GPU).
    meta = {**blocks, "UPCAST": _interpreted(), "PRECISION": "ieee" if hidden.dtype == torch.float32 else "tf32"}
    row_blocks, tiles = triton.cdiv(N, blocks["BLOCK_N"]), triton.cdiv(V, blocks["BLOCK_V"])
    wanted = 4 * torch.cuda.get_device_properties(hidden.device).multi_processor_count if hidden.is_cuda else 2
    return meta, max(1, min(tiles, triton.cdiv(wanted, row_blocks)))


class _TritonLinearLogprob(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, targets, temperature):
        hidden, weight, targets = hidden.contiguous(), weight.contiguous(), targets.contiguous()
        (N, H), V = hidden.shape, weight.shape[0]
        meta, splits = _forward_launch(hidden, weight)
        split_len = triton.cdiv(triton.cdiv(V, splits), meta["BLOCK_V"]) * meta["BLOCK_V"]
        splits = triton.cdiv(V, split_len)  # every split holds at least one column
        m, l, a, z_target = (torch.empty(splits, N, dtype=torch.float32, device=hidden.device) for _ in range(4))
        grid = (triton.cdiv(N, meta["BLOCK_N"]), splits)
        _forward_kernel[grid](hidden, weight, targets, m, l, a, z_target, N, V, H, 1.0 / temperature, split_len,
                              **meta)
        top = m.max(0).values
        scale = torch.exp(m - top)
        total = (l * scale).sum(0)
        lse = top + torch.log(total)
        logp, entropy = z_target.sum(0) - lse, lse - (a * scale).sum(0) / total
        ctx.save_for_backward(hidden, weight, targets, entropy, lse)
        ctx.temperature = temperature
        return logp, entropy

    @staticmethod
    def backward(ctx, grad_logp, grad_entropy):
        hidden, weight, targets, entropy, lse = ctx.saved_tensors
        N, V = hidden.shape[0], weight.shape[0]
        g, e = grad_logp.float().contiguous(), grad_entropy.float().contiguous()
        grad_hidden = torch.empty_like(hidden)
        grad_weight = torch.zeros_like(weight)
        chunk = max(256, BACKWARD_CHUNK_BYTES // (V * hidden.element_size()))
        for start in range(0, N, chunk):
            rows = slice(start, start + chunk)
            h = hidden[rows]
            ds = h @ weight.T  # (C, V) logits, overwritten with their gradient
            _logits_to_grad_kernel[(h.shape[0], triton.cdiv(V, GRAD_BLOCK_V))](
                ds, targets[rows], g[rows], e[rows], entropy[rows], lse[rows], V, 1.0 / ctx.temperature,
                BLOCK_V=GRAD_BLOCK_V)
            torch.mm(ds, weight, out=grad_hidden[rows])
            grad_weight.addmm_(ds.T, h)
        return grad_hidden, grad_weight, None, None


def linear_logprob_triton(hidden, weight, targets, temperature: float = 1.0):
    if triton is None:
        raise RuntimeError("the Triton path needs `pip install triton` (CUDA, or CPU with TRITON_INTERPRET=1)")
    return _TritonLinearLogprob.apply(hidden, weight, targets, temperature)
