"""Kernels against a direct PyTorch expression: fp32 and bf16, odd shapes, temperature, gradients.
The Triton path runs on CPU under TRITON_INTERPRET=1 (set before triton is imported: conftest)."""

import importlib

import pytest
import torch

from agentrl.kernels.linear_logprob import linear_logprob_torch, linear_logprob_triton, triton

TOL = {torch.float32: dict(atol=2e-4, rtol=2e-4), torch.bfloat16: dict(atol=3e-2, rtol=3e-2)}
IMPLS = [pytest.param(linear_logprob_torch, id="torch"),
         pytest.param(linear_logprob_triton, id="triton",
                      marks=pytest.mark.skipif(triton is None, reason="triton not installed"))]


def direct(hidden, weight, targets, temperature):
    logits = (hidden.float() @ weight.float().T) / temperature  # (N, V): the naive expression
    logp_all = torch.log_softmax(logits, -1)
    return logp_all.gather(-1, targets[:, None])[:, 0], -(logp_all.exp() * logp_all).sum(-1)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n,h,v,temperature", [(37, 48, 131, 1.0), (5, 32, 70, 0.7), (64, 40, 257, 1.3)])
def test_linear_logprob_matches_direct_expression(impl, dtype, n, h, v, temperature):
    g = torch.Generator().manual_seed(n + v)
    hidden = torch.randn(n, h, generator=g).to(dtype).requires_grad_()
    weight = (torch.randn(v, h, generator=g) / h ** 0.5).to(dtype).requires_grad_()
    targets = torch.randint(0, v, (n,), generator=g)
    up_logp, up_ent = torch.randn(n, generator=g), torch.randn(n, generator=g)

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


def test_torch_path_chunks_rows(monkeypatch):
    module = importlib.import_module("agentrl.kernels.linear_logprob")  # the package re-exports a same-named function
    monkeypatch.setattr(module, "CHUNK_ROWS", 4)  # 11 rows -> 3 chunks, same result
    g = torch.Generator().manual_seed(0)
    hidden, weight = torch.randn(11, 16, generator=g), torch.randn(30, 16, generator=g)
    targets = torch.randint(0, 30, (11,), generator=g)
    torch.testing.assert_close(linear_logprob_torch(hidden, weight, targets)[0], direct(hidden, weight, targets, 1.0)[0])


@pytest.mark.skipif(triton is None, reason="triton not installed")
def test_actor_log_probs_through_the_triton_path(tiny_model_dir, monkeypatch):
    from agentrl.actor.batch import TrainSample, micro_batches
    from agentrl.actor.single import response_logprobs
    from agentrl.models import load_model

    model = load_model(tiny_model_dir)
    samples = [TrainSample.from_turn([5, 9, 11, 40], [17, 3, 8]), TrainSample.from_turn([7, 7], [30, 31, 32, 33])]
    batch = micro_batches(samples, 10**6)[0]
    results = {}
    for choice in ("torch", "triton"):
        monkeypatch.setenv("AGENTRL_KERNELS", choice)
        model.zero_grad()
        logp, entropy = response_logprobs(model, batch, temperature=0.9, entropy=True)
        (logp.sum() + entropy.sum()).backward()
        results[choice] = logp.detach(), entropy.detach(), model.lm_head.weight.grad.clone()
    for a, b in zip(results["torch"], results["triton"]):
        torch.testing.assert_close(a, b, atol=2e-4, rtol=2e-4)


@pytest.mark.skipif(triton is None, reason="triton not installed")
@pytest.mark.parametrize("dual_clip", [3.0, None])
def test_seq_ratio_kernel_matches_pytorch(monkeypatch, dual_clip):
    from agentrl.config import SeqRatioConfig
    from agentrl.kernels.seq_ratio import seq_ratio_triton
    from agentrl.losses.policy import seq_ratio

    g = torch.Generator().manual_seed(3)
    lengths = [1, 7, 130, 3, 40, 2]  # one action longer than the kernel's block
    segments = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))
    n = segments.numel()
    old = -torch.rand(n, generator=g) * 3
    shift = torch.randn(n, generator=g) * 0.4 + 1.5 * (segments == 3)  # action 3: ratio ~4.5, A < 0
    logp = (old + shift).requires_grad_()
    adv = torch.tensor([2.0, -1.5, 0.7, -3.0, 1.0, -0.2])[segments]
    up = torch.randn(n, generator=g)
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
    assert ref_counts["pg_clipfrac"] > 0 and (dual_clip is None or ref_counts["pg_clipfrac_dual"] == 3)
