"""Fused kernels for the loss path, one op per file (Triton kernel + autograd.Function + a
chunked PyTorch path). `linear_logprob` dispatches: Triton for CUDA tensors when Triton is
installed (or AGENTRL_KERNELS=triton, e.g. on CPU under TRITON_INTERPRET=1), else PyTorch."""

from __future__ import annotations

import os

from agentrl.kernels.linear_logprob import linear_logprob_torch, linear_logprob_triton, triton


def use_triton(tensor) -> bool:
    choice = os.environ.get("AGENTRL_KERNELS", "auto")
    if choice not in ("auto", "triton", "torch"):
        raise ValueError(f"AGENTRL_KERNELS={choice!r}: choose auto, triton or torch")
    if choice == "auto":
        return triton is not None and tensor.is_cuda
    return choice == "triton"


def linear_logprob(hidden, weight, targets, temperature: float = 1.0):
    """(log p(target), entropy), each (N,) fp32, of softmax(hidden @ weight.T / temperature)."""
    impl = linear_logprob_triton if use_triton(hidden) else linear_logprob_torch
    return impl(hidden, weight, targets, temperature)
