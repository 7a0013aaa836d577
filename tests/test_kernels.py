"""Kernels against a direct PyTorch expression: fp32 and bf16, odd shapes, temperature, gradients.
The Triton path runs on a GPU where there is one, else on CPU under TRITON_INTERPRET=1 (set
before triton is imported: conftest)."""

import importlib

import pytest
import torch

from agentrl.kernels.linear_logprob import linear_logprob_torch, linear_logprob_triton, triton

TOL = {torch.float32: dict(atol=2e-4, rtol=2e-4), torch.bfloat16: dict(atol=3e-2, rtol=3e-2)}
GPU = torch.cuda.is_available()
TRITON_DEVICE = "cuda" if GPU else "cpu"
needs_triton = pytest.mark.skipif(triton is None, reason="triton not installed")
needs_gpu = pytest.mark.skipif(not GPU, reason="needs a CUDA GPU")
IMPLS = [pytest.param(linear_logprob_torch, "cpu", id="torch-cpu"),
         pytest.param(linear_logprob_torch, "cuda", id="torch-cuda", marks=needs_gpu),
         pytest.param(linear_logprob_triton, TRITON_DEVICE, id=f"triton-{TRITON_DEVICE}", marks=needs_triton)]


def direct(hidden, weight, targets, temperature):
    logits = (hidden.float() @ weight.float().T) / temperature  # (N, V): the naive expression
    logp_all = torch.log_softmax(logits, -1)
    return logp_all.gather(-1, targets[:, None])[:, 0], -(logp_all.exp() * logp_all).sum(-1)


def check_against_direct(impl, device, dtype, n, h, v, temperature):
    g = torch.Generator().manual_seed(n + v)
    hidden = torch.randn(n, h, generator=g).to(device, dtype).requires_grad_()
    weight = (torch.randn(v, h, generator=g) / h ** 0.5).to(device, dtype).requires_grad_()
    targets = torch.randint(0, v, (n,), generator=g)
    targets[0] = v - 1  # a target in the last vocabulary tile (and the Triton path's last split)
    targets = targets.to(device)
    up_logp, up_ent = torch.randn(n, generator=g).to(device), torch.randn(n, generator=g).to(device)

    logp, entropy = impl(hidden, weight, targets, temperature)
    (logp * up_logp + entropy * up_ent).sum().backward()
    grads = hidden.grad.float(), weight.grad.float()
    hidden.grad = weight.grad = None

    ref_logp, ref_entropy = direct(hidden, weight, targets, temperature)
    (ref_logp * up_logp + ref_entropy * up_ent).sum().backward()
    tol = TOL[dtype]
    torch.testing.assert_close(logp, ref_logp, **tol)
    torch.testing.assert_close(entropy, ref_entropy, **tol)
    torch.testing.assert_close(grads[0], hidden.grad.float(), **tol)
    torch.testing.assert_close(grads[1], weight.grad.float(), **tol)


@pytest.mark.parametrize("impl,device", IMPLS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n,h,v,temperature", [(37, 48, 131, 1.0), (5, 32, 70, 0.7), (64, 40, 257, 1.3)])
def test_linear_logprob_matches_direct_expression(impl, device, dtype, n, h, v, temperature):
    check_against_direct(impl, device, dtype, n, h, v, temperature)


@needs_triton
def test_triton_backward_in_row_chunks(monkeypatch):
    module = importlib.import_module("agentrl.kernels.linear_logprob")
    monkeypatch.setattr(module, "BACKWARD_CHUNK_BYTES", 1)  # 16-row chunks: 37 rows -> 3 chunks
    check_against_direct(linear_logprob_triton, TRITON_DEVICE, torch.float32, 37, 48, 131, 0.8)


@needs_gpu
@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_triton_at_model_shapes(dtype):
    """Full GPU tile sizes, several vocabulary splits and an odd vocabulary."""
    check_against_direct(linear_logprob_triton, "cuda", dtype, 1000, 896, 32003, 1.0)


def test_torch_path_chunks_rows(monkeypatch):
    module = importlib.import_module("agentrl.kernels.linear_logprob")  # the package re-exports a same-named function
    monkeypatch.setattr(module, "CHUNK_ROWS", 4)  # 11 rows -> 3 chunks, same values and gradients
    check_against_direct(linear_logprob_torch, "cpu", torch.float32, 11, 16, 30, 1.0)


@needs_triton
def test_actor_log_probs_through_the_triton_path(tiny_model_dir, monkeypatch):
    from agentrl.packing import TrainSample, micro_batches
    from agentrl.forward import response_logprobs
    from agentrl.models import load_model

    model = load_model(tiny_model_dir).to(TRITON_DEVICE)
    samples = [TrainSample.from_turn([5, 9, 11, 40], [17, 3, 8]), TrainSample.from_turn([7, 7], [30, 31, 32, 33])]
    batch = micro_batches(samples, 10**6)[0].to(TRITON_DEVICE)
    results = {}
    for choice in ("torch", "triton"):
        monkeypatch.setenv("AGENTRL_KERNELS", choice)
        model.zero_grad()
        logp, entropy = response_logprobs(model, batch, temperature=0.9, entropy=True)
        (logp.sum() + entropy.sum()).backward()
        results[choice] = logp.detach(), entropy.detach(), model.lm_head.weight.grad.clone()
    for a, b in zip(results["torch"], results["triton"]):
        torch.testing.assert_close(a, b, atol=2e-4, rtol=2e-4)


@needs_triton
@pytest.mark.parametrize("dual_clip", [3.0, None])
def test_seq_ratio_kernel_matches_pytorch(monkeypatch, dual_clip):
    from agentrl.kernels.seq_ratio import seq_ratio_triton
    from agentrl.losses.policy import SeqRatioConfig, seq_ratio

    g = torch.Generator().manual_seed(3)
    lengths = [1, 7, 130, 3, 40, 2]  # one action longer than the kernel's block
    segments = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))
    n = segments.numel()
    old = -torch.rand(n, generator=g) * 3
    # action 3: ratio ~4.5 with A < 0 (dual-clipped); action 4: ratio ~1.8 with A > 0 (clipped, 40 tokens)
    shift = torch.randn(n, generator=g) * 0.4 + 1.5 * (segments == 3) + 0.6 * (segments == 4)
    adv = torch.tensor([2.0, -1.5, 0.7, -3.0, 1.0, -0.2])[segments]
    up = torch.randn(n, generator=g)
    segments, old, shift, adv, up = (t.to(TRITON_DEVICE) for t in (segments, old, shift, adv, up))
    logp = (old + shift).requires_grad_()
    config = SeqRatioConfig(clip_low=0.2, clip_high=0.28, dual_clip=dual_clip)

    monkeypatch.setenv("AGENTRL_KERNELS", "torch")
    ref, ref_counts = seq_ratio(logp, old, adv, segments, config)
    (ref * up).sum().backward()
    ref_grad, logp.grad = logp.grad.clone(), None
    loss, counts = seq_ratio_triton(logp, old, adv, segments, config)
    (loss * up).sum().backward()

    torch.testing.assert_close(loss, ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(logp.grad, ref_grad, atol=1e-5, rtol=1e-5)
    assert set(counts) == set(ref_counts)
    for key in counts:
        assert counts[key].item() == ref_counts[key].item()
    # counted per token: the 40-token action clipped counts 40, not 1
    assert ref_counts["pg_clipfrac"] >= 40 and (dual_clip is None or ref_counts["pg_clipfrac_dual"] == 3)
