"""Prefix packing computes each shared prompt once and changes nothing else: per-token log-probs,
entropies, losses and every parameter's gradient equal those of the unpacked batch (fp32, atol
1e-5), with prompts of unequal lengths, prompts shared by several samples or by none, rows cut
by the token budget, and samples whose prompts share only a leading part."""

import pytest
import torch

from agentrl.forward import response_logprobs
from agentrl.losses.policy import PPOClipConfig, ppo_clip
from agentrl.models import load_model
from agentrl.packing import Packing, TrainSample, micro_batches, per_sample


def step_samples(seed: int = 0) -> list[TrainSample]:
    """A task group's step samples: 4 prompts (lengths 9 to 31; two share their first 6 tokens)
    each answered 1 to 5 times with responses of 2 to 9 tokens, in shuffled order."""
    g = torch.Generator().manual_seed(seed)
    common = torch.randint(3, 200, (6,), generator=g).tolist()
    prompts = [torch.randint(3, 200, (n,), generator=g).tolist() for n in (9, 31, 17)]
    prompts.append(common + [7, 8, 9])
    prompts[0] = common + prompts[0][6:]
    samples = []
    for prompt, answers in zip(prompts, (5, 3, 1, 4)):
        for _ in range(answers):
            n = int(torch.randint(2, 10, (1,), generator=g))
            response = torch.randint(3, 200, (n,), generator=g).tolist()
            samples.append(TrainSample.from_turn(prompt, response, old_logprobs=[-1.0] * n,
                                                 advantages=torch.randn(n, generator=g).tolist()))
    order = torch.randperm(len(samples), generator=g).tolist()
    return [samples[i] for i in order]


def forward_backward(model, samples, budget, pack):
    """Per-sample log-probs and entropies, the loss and every gradient, over `samples` in
    micro-batches of `budget` tokens."""
    model.zero_grad(set_to_none=True)
    total, computed = 0.0, 0
    for batch in micro_batches(samples, budget, pack=pack):
        batch = batch.to(model.device)
        logp, _ = response_logprobs(model, batch, 0.8, entropy=True)
        loss, _ = ppo_clip(logp, batch.old_logprobs, batch.advantages, batch.sample_index, PPOClipConfig())
        loss.sum().backward()
        total += float(loss.detach().sum())
        computed += batch.n_computed
    scored = per_sample(samples, budget, 0, lambda bs: [torch.stack(response_logprobs(model, b, 0.8, entropy=True))
                                                        .detach().T for b in bs], pack=pack)
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return scored, total, grads, computed


def assert_packed_equals_plain(model, samples, budget: int = 10**6, grad_noise: float = 0.0) -> tuple[int, int]:
    """Packed and unpacked give the same per-token log-probs and entropies, loss and gradients
    (atol 1e-5, plus `grad_noise` x a gradient's largest element for long sequences); returns the
    tokens each computed (unpacked, packed)."""
    plain, plain_loss, plain_grads, plain_tokens = forward_backward(model, samples, budget, pack=None)
    packed, packed_loss, packed_grads, packed_tokens = forward_backward(model, samples, budget, pack=Packing())
    for a, b in zip(plain, packed):
        torch.testing.assert_close(b, a, atol=1e-5, rtol=0)  # (n_targets, 2): log-prob, entropy
    assert packed_loss == pytest.approx(plain_loss, abs=1e-5)
    assert plain_grads.keys() == packed_grads.keys() and len(plain_grads) > 5
    for name, grad in plain_grads.items():
        atol = 1e-5 + grad_noise * float(grad.abs().max())
        torch.testing.assert_close(packed_grads[name], grad, atol=atol, rtol=0, msg=name)
    return plain_tokens, packed_tokens


CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=CUDA)])
@pytest.mark.parametrize("budget", [10**6, 60])
def test_packed_equals_unpacked(tiny_model_dir, budget, device):
    """On a GPU too: there the tree mask runs SDPA's masked kernel, the plain rows its causal one."""
    model = load_model(tiny_model_dir).float().to(device)
    samples = step_samples()
    plain_tokens, packed_tokens = assert_packed_equals_plain(model, samples, budget)
    assert packed_tokens < 0.6 * plain_tokens  # 13 samples on 4 prompts: the prompts once
    if budget == 10**6:  # every repeat of a prompt saved (5 x 9, 3 x 31, 1 x 17, 4 x 9 tokens), and
        # the 6 leading tokens two of the prompts share computed once
        assert packed_tokens == plain_tokens - (4 * 9 + 2 * 31 + 0 * 17 + 3 * 9) - 6


def test_nested_prefixes_pack_as_one_tree_and_equal_unpacked(tiny_model_dir):
    """Prompts that share leading parts at several depths (one prompt the start of another, two
    more branching off a shared head) in one row: each distinct leading token computed once,
    and the same log-probs and gradients as unpacked."""
    g = torch.Generator().manual_seed(3)
    head, a, b = (torch.randint(3, 200, (n,), generator=g).tolist() for n in (8, 6, 5))
    prompts = [head + a, head + a[:3], head + a + b, head + b, head[:5] + b]
    samples = [TrainSample.from_turn(p, torch.randint(3, 200, (3,), generator=g).tolist(), old_logprobs=[-1.0] * 3,
                                     advantages=torch.randn(3, generator=g).tolist()) for p in prompts for _ in range(2)]
    samples = [samples[i] for i in torch.randperm(len(samples), generator=g).tolist()]
    model = load_model(tiny_model_dir).float()
    _, computed = assert_packed_equals_plain(model, samples)
    distinct = len({tuple(p[:i]) for p in prompts for i in range(1, len(p) + 1)})  # the prompts' tree
    assert computed == distinct + 3 * len(samples) == 8 + 6 + 5 + 5 + 5 + 30


def test_packed_rows_respect_the_budget_and_keep_sample_order(tiny_model_dir):
    samples = step_samples(1)
    assert micro_batches([], 60, pack=Packing()) == []  # a step whose episodes all aborted
    for budget in (40, 60, 10**6):
        batches = micro_batches(samples, budget, pack=Packing())
        assert all(b.input_ids.numel() <= max(budget, max(len(s.ids) for s in samples)) for b in batches)
        assert sum(b.n_tokens for b in batches) == sum(s.n_targets for s in samples)
        assert sum(int(b.advantages.numel()) for b in batches) == sum(s.n_targets for s in samples)


def test_a_sample_joins_a_row_only_when_sharing_pays_for_the_longer_attention(tiny_model_dir):
    """Three 100-token samples: two share 90 leading tokens, the third only the first 10. At a
    small model's pair cost (the tiny model's, about 1e-3 tokens of work per attention pair) the
    two share a row of 110 tokens and the third takes a row of its own: one row of 200 would save
    10 more tokens but compute 200^2 pairs against 110^2 + 100^2. Without an attention cost, one
    row. Either way the layout is modelled cheaper than one row per sample."""
    from transformers import AutoConfig

    def sample(shared, i):
        return TrainSample.from_turn(list(range(3, 3 + shared)) + [200 + i] * (95 - shared), [100 + i] * 5)

    samples = [sample(90, 0), sample(90, 1), sample(10, 2)]
    cost = Packing.for_model(AutoConfig.from_pretrained(tiny_model_dir))
    assert 5e-4 < cost.pair_cost < 5e-3
    assert micro_batches(samples, 10**6, pack=cost)[0].input_ids.shape == (2, 110)
    assert micro_batches(samples, 10**6, pack=Packing())[0].input_ids.shape == (1, 200)
    # A config's own head size (Qwen3's and Gemma's differ from hidden / heads): wider heads, more
    # attention work per pair against the weights.
    wide = AutoConfig.from_pretrained(tiny_model_dir)
    wide.head_dim = 2 * wide.hidden_size // wide.num_attention_heads
    assert Packing.for_model(wide).pair_cost > 1.2 * cost.pair_cost
    # Sharing 10 tokens of 100 pays for no longer row at that cost: one row per sample.
    assert micro_batches(samples[1:], 10**6, pack=cost)[0].mask.shape == (2, 100)
    assert micro_batches(samples[1:], 10**6, pack=cost)[0].subtree_end is None


def test_the_layout_with_less_padding_is_taken_where_its_modelled_work_is_less():
    """At a pair cost of 0.01: two 100-token samples sharing 90 leading tokens make a row of 110,
    and a 20-token one sharing 10 would lengthen it to 120 (2,300 more attention pairs for 10
    tokens saved), so by the joining rule it starts a row of its own. In one micro-batch that row
    pads to 110: 2 x 110 x (1 + 0.01 x 110) = 462 of modelled work, against one row of all three,
    120 x (1 + 0.01 x 120) = 264 (one row per sample: 600). The row of 120 is taken."""
    def sample(shared, i, n):
        return TrainSample.from_turn(list(range(3, 3 + shared)) + [200 + i] * (n - 5 - shared), [100 + i] * 5)

    samples = [sample(90, 0, 100), sample(90, 1, 100), sample(10, 2, 20)]
    assert micro_batches(samples, 10**6, pack=Packing(pair_cost=0.01))[0].input_ids.shape == (1, 120)


def test_a_suffix_never_sees_another_suffix(tiny_model_dir):
    """Changing one sample's response leaves every other sample's log-probs in its row untouched
    (and changing the shared prompt changes them all)."""
    model = load_model(tiny_model_dir).float()
    prompt = list(range(20, 40))
    samples = [TrainSample.from_turn(prompt, [50 + i, 60 + i, 70 + i]) for i in range(3)]
    changed = samples[:1] + [TrainSample.from_turn(prompt, [90, 91, 92, 93, 94])] + samples[2:]
    with torch.no_grad():
        before = per_sample(samples, 10**6, 0, lambda bs: [response_logprobs(model, b)[0] for b in bs], pack=Packing())
        after = per_sample(changed, 10**6, 0, lambda bs: [response_logprobs(model, b)[0] for b in bs], pack=Packing())
    assert micro_batches(samples, 10**6, pack=Packing())[0].input_ids.shape == (1, 20 + 9)  # one row
    torch.testing.assert_close(after[0], before[0], atol=1e-6, rtol=0)
    torch.testing.assert_close(after[2], before[2], atol=1e-6, rtol=0)


def test_rl_steps_packed_and_unpacked_end_with_the_same_weights(tiny_model_dir, tmp_path):
    """3 RL steps (update, sampler check, KL reference all packed) against the same steps
    unpacked: the same episodes, the same weights (within 1% of what AdamW can move them), and the
    update runs fewer tokens.
    (An entropy bonus gives every update a real gradient: with none, as when no episode of a
    random model succeeds, AdamW would turn float noise of either run into full-size steps.)"""
    from safetensors.torch import load_file
    from test_trainer import run, small_config

    from agentrl.checkpoint import list_checkpoints
    from agentrl.tracking import read_metrics

    runs = {}
    for pack in (True, False):
        config = small_config(tmp_path / str(pack), 3, pack_prefixes=pack, check_logprobs_every=1,
                              entropy_coef=0.01)
        run(config, tiny_model_dir)
        runs[pack] = (load_file(list_checkpoints(tmp_path / str(pack))[-1] / "model" / "model.safetensors"),
                      read_metrics(tmp_path / str(pack) / "logs" / "metrics.jsonl"))
    (packed, packed_rows), (plain, plain_rows) = runs[True], runs[False]
    # AdamW moves a weight by up to lr per step whatever its gradient's size, so float noise in a
    # near-zero gradient can move it by a fraction of lr: allow 1% of the 3 steps' reach (3e-5).
    for name, weight in plain.items():
        torch.testing.assert_close(packed[name], weight, atol=0.01 * 1e-3 * 3, rtol=0, msg=name)
    for p, q in zip(packed_rows, plain_rows):
        assert p["tokens/processed"] == q["tokens/processed"] and p["rollout/length"] == q["rollout/length"]
        assert q["tokens/computed"] == q["tokens/processed"]  # unpacked: every sample's tokens
        assert p["tokens/computed"] < 0.8 * p["tokens/processed"]
        assert p["rollout/logprob_diff_max"] < 1e-4


def test_packed_equals_unpacked_with_eager_attention(tiny_model_dir):
    """A model on eager attention takes the tree mask as an additive bias (0 where a token may
    attend, the dtype's minimum elsewhere): the same log-probs and gradients as unpacked."""
    model = load_model(tiny_model_dir).float()
    model.set_attn_implementation("eager")
    assert model.config._attn_implementation == "eager"
    plain_tokens, packed_tokens = assert_packed_equals_plain(model, step_samples())
    assert packed_tokens < 0.6 * plain_tokens


def test_a_samples_first_token_is_never_trained():
    """Nothing predicts a sequence's first token: collate leaves it untrained whatever its mask."""
    from agentrl.packing import collate

    batch = collate([TrainSample([5, 6, 7], [True, True, True]), TrainSample([5, 6], [False, True])])
    assert batch.mask.tolist() == [[False, True, True], [False, True, False]] and batch.n_tokens == 3
    # Packed as a prefix tree too: the first token is its prefix, shared, never trained.
    samples = [TrainSample([5, 6, 8], [False, True, True]), TrainSample([5, 6, 7], [True, True, True])]
    [packed] = micro_batches(samples, 10**6, pack=Packing())
    assert packed.input_ids.tolist() == [[5, 6, 8, 6, 7]] and packed.n_tokens == 4


def test_a_field_some_samples_lack_is_refused_not_dropped():
    """A per-token field that some of a batch's samples have and others lack would leave the
    losses reading misaligned values, or none: collate refuses it by name."""
    from agentrl.packing import collate

    samples = [TrainSample.from_turn([1, 2], [3], advantages=[1.0]), TrainSample.from_turn([1], [4, 5])]
    with pytest.raises(ValueError, match="1 of 2 samples have advantages"):
        collate(samples)
