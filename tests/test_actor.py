import pytest
import torch

from agentrl.actor.single import SingleActor
from agentrl.config import OptimConfig, SamplingConfig
from agentrl.forward import response_logprobs
from agentrl.losses.policy import PPOClipConfig, SeqRatioConfig, aggregation_weights, ppo_clip, seq_ratio
from agentrl.metrics import LossOutputs
from agentrl.models import load_model, load_tokenizer
from agentrl.packing import Packing, TrainSample, collate, micro_batches
from agentrl.registry import KL_ESTIMATORS
from agentrl.sampler import shared_decode
from agentrl.sampler.hf import HFSampler


def test_sampler_logprobs_equal_actor_logprobs(tiny_model_dir):
    tokenizer, model = load_tokenizer(tiny_model_dir), load_model(tiny_model_dir)
    sampler = HFSampler(model, tokenizer)
    prompts = [tokenizer("Task: put a apple in shelf.\nObservation: You arrive at desk 1.").input_ids,
               tokenizer("Actions: go to desk 1, look").input_ids,
               tokenizer("Observation: Nothing happens.").input_ids[:5]]
    torch.manual_seed(0)
    for temperature in (1.0, 0.7):
        gens = sampler.generate(prompts, SamplingConfig(temperature=temperature, max_new_tokens=12))
        samples = [TrainSample.from_turn(p, g.token_ids, old_logprobs=g.logprobs) for p, g in zip(prompts, gens)]
        batch = collate(samples, tokenizer.pad_token_id)
        with torch.no_grad():
            logp, _ = response_logprobs(model, batch, temperature)
        assert logp.shape == batch.old_logprobs.shape
        torch.testing.assert_close(logp.cpu(), batch.old_logprobs, atol=2e-4, rtol=0)


def test_response_logprobs_match_full_log_softmax(tiny_model_dir):
    model = load_model(tiny_model_dir)
    sample = TrainSample.from_turn([5, 6, 7, 8], [9, 10, 11])
    batch = collate([sample, TrainSample.from_turn([3, 4], [12, 13, 14, 15])])
    with torch.no_grad():
        logp, entropy = (t.cpu() for t in response_logprobs(model, batch, 1.0, entropy=True))
        full = torch.log_softmax(model(input_ids=batch.input_ids[:1, :7].to(model.device)).logits[0].float(), -1).cpu()
    expected = full[3:6].gather(-1, torch.tensor([[9], [10], [11]])).squeeze(-1)
    torch.testing.assert_close(logp[:3], expected, atol=1e-5, rtol=0)
    torch.testing.assert_close(entropy[:3], -(full[3:6].exp() * full[3:6]).sum(-1), atol=1e-4, rtol=0)
    model.lm_head = torch.nn.Linear(model.config.hidden_size, model.config.vocab_size)  # with a bias: refused
    with pytest.raises(ValueError, match="the fused log-prob assumes an lm_head without bias"):
        response_logprobs(model, batch)


def _grads_after_step(model_dir, samples, budget, agg="token-mean"):
    torch.manual_seed(0)
    model = load_model(model_dir)
    actor = SingleActor(model, OptimConfig(lr=1e-3))
    for s, w in zip(samples, aggregation_weights([s.n_targets for s in samples], agg)):
        s.weight = [w] * s.n_targets

    def loss_fn(batch):
        logp, _ = actor.token_logprobs(batch)
        loss, _ = ppo_clip(logp, batch.old_logprobs, batch.advantages, batch.sample_index, PPOClipConfig())
        return LossOutputs((batch.weight * loss).sum())

    actor.optimizer_step([(micro_batches(samples, budget), loss_fn)])
    return {n: p.grad.clone() for n, p in model.named_parameters()}  # the step leaves its gradients


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
def test_update_does_not_depend_on_micro_batch_split(tiny_model_dir, agg):
    g = torch.Generator().manual_seed(1)
    samples = []
    for i in range(7):
        n_prompt, n_resp = 3 + i, 2 + (i * 3) % 5
        ids = torch.randint(10, 300, (n_prompt + n_resp,), generator=g).tolist()
        samples.append(TrainSample.from_turn(ids[:n_prompt], ids[n_prompt:],
                                             old_logprobs=(-torch.rand(n_resp, generator=g)).tolist(),
                                             advantages=[float(i % 3) - 1.0] * n_resp))
    one = _grads_after_step(tiny_model_dir, samples, budget=10**6, agg=agg)
    many = _grads_after_step(tiny_model_dir, samples, budget=16, agg=agg)
    assert len(micro_batches(samples, 16)) > 3
    for name in one:
        torch.testing.assert_close(one[name], many[name], atol=1e-7, rtol=1e-4)


def test_activation_checkpointing_runs_each_layer_again_in_backward_with_the_same_gradients(tiny_model_dir):
    """`actor.activation_checkpointing` (the single actor's, through the registry as the trainer
    builds it): each decoder layer's forward runs twice per update, once more in backward, and the
    gradients are those of the update without it."""
    from agentrl.actor import SingleActorConfig  # (importing it registers the backends)
    from agentrl.registry import ACTORS

    g = torch.Generator().manual_seed(2)
    ids = torch.randint(10, 300, (12,), generator=g).tolist()
    grads, calls = {}, {}
    for checkpointing in (False, True):
        torch.manual_seed(0)
        model = load_model(tiny_model_dir)
        actor = ACTORS.get("single")(SingleActorConfig(activation_checkpointing=checkpointing), model,
                                     OptimConfig(lr=1e-3), [])
        counted = []
        model.model.layers[0].register_forward_pre_hook(lambda *_: counted.append(1))  # (a recompute stops early)
        sample = TrainSample.from_turn(ids[:7], ids[7:], old_logprobs=[-1.0] * 5, advantages=[1.0] * 5)
        sample.weight = [0.2] * 5

        def loss_fn(batch):
            logp, _ = actor.token_logprobs(batch)
            loss, _ = ppo_clip(logp, batch.old_logprobs, batch.advantages, batch.sample_index, PPOClipConfig())
            return LossOutputs((batch.weight * loss).sum())

        actor.optimizer_step([(micro_batches([sample], 10**6), loss_fn)])
        grads[checkpointing] = {n: p.grad.clone() for n, p in model.named_parameters()}
        calls[checkpointing] = len(counted)
    assert calls == {False: 1, True: 2}
    for name, grad in grads[False].items():
        torch.testing.assert_close(grads[True][name], grad, atol=1e-7, rtol=1e-5)


def test_ppo_clip_by_hand():
    logp = torch.log(torch.tensor([1.5, 0.5, 0.5, 4.0, 1.1]))
    old = torch.zeros(5)
    adv = torch.tensor([1.0, 1.0, -1.0, -1.0, 1.0])
    loss, counts = ppo_clip(logp, old, adv, torch.arange(5), PPOClipConfig(dual_clip=3.0))
    # ratio 1.5, A=+1: min(1.5, 1.2) -> -1.2 ; ratio 0.5, A=+1: -0.5 (unclipped wins the max)
    # ratio 0.5, A=-1: max(0.5, 0.8) = 0.8 ; ratio 4, A=-1: max(4, 1.2) = 4 capped by dual clip at 3
    # ratio 1.1 lies inside the clip range: not clipped
    torch.testing.assert_close(loss, torch.tensor([-1.2, -0.5, 0.8, 3.0, -1.1]))
    assert counts["pg_clipfrac"] == 2 and counts["pg_clipfrac_dual"] == 1


def test_seq_ratio_loss_and_gradient_match_a_direct_expression():
    g = torch.Generator().manual_seed(0)
    segments = torch.tensor([0, 0, 0, 1, 2, 2, 3, 3, 3, 3])
    adv_per_action = torch.tensor([1.5, -2.0, 0.3, -0.7])
    logp = (-torch.rand(10, generator=g) * 2).requires_grad_()
    old = -torch.rand(10, generator=g) * 2
    config = SeqRatioConfig(clip_low=0.2, clip_high=0.28, dual_clip=3.0)
    loss, _ = seq_ratio(logp, old, adv_per_action[segments], segments, config)
    loss.sum().backward()

    logp2 = logp.detach().clone().requires_grad_()
    total = 0
    for action in range(4):
        idx = (segments == action).nonzero().squeeze(-1)
        s = torch.exp((logp2[idx] - old[idx]).mean())
        a = adv_per_action[action]
        obj = torch.maximum(-a * s, -a * torch.clamp(s, 0.8, 1.28))
        if a < 0:
            obj = torch.minimum(obj, -a * 3.0)
        total = total + obj * len(idx)  # every token of the action carries the action's loss
    total.backward()
    torch.testing.assert_close(loss.sum(), total.detach())
    torch.testing.assert_close(logp.grad, logp2.grad)


def test_aggregation_weights_and_kl_estimators_by_hand():
    # lengths 2 and 4: token-mean 1/6 each token; seq-mean-token-mean (1/2)(1/2), (1/2)(1/4); token-sum 1/2
    assert aggregation_weights([2, 4], "token-mean") == [1 / 6, 1 / 6]
    assert aggregation_weights([2, 4], "seq-mean-token-mean") == [0.25, 0.125]
    assert aggregation_weights([2, 4], "seq-mean-token-sum") == [0.5, 0.5]
    # One rank's share [2] of the mini-batch [2, 4] with the global totals: the same weights.
    for mode in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum"):
        assert aggregation_weights([2], mode, (6, 2)) == aggregation_weights([2, 4], mode)[:1]
    logp, ref = torch.tensor([-1.0, -2.0]), torch.tensor([-1.5, -1.0])
    torch.testing.assert_close(KL_ESTIMATORS.get("k1")(logp, ref), torch.tensor([0.5, -1.0]))
    torch.testing.assert_close(KL_ESTIMATORS.get("k2")(logp, ref), torch.tensor([0.125, 0.5]))
    r = torch.tensor([-0.5, 1.0])  # log(ref / pi)
    torch.testing.assert_close(KL_ESTIMATORS.get("k3")(logp, ref), torch.exp(r) - r - 1)


def test_bf16_weights_learn_through_fp32_master_weights_and_resume_exactly(tiny_model_dir, tmp_path):
    """A bf16 model's AdamW steps at lr 1e-6 are far below bf16's spacing: applied to the bf16
    weights they would round away. The single actor accumulates them in fp32 master weights
    (which its checkpoint saves) and the bf16 model follows them."""
    from agentrl.packing import TrainSample, micro_batches
    from agentrl.actor.single import SingleActor
    from agentrl.config import OptimConfig
    from agentrl.models import load_model

    model = load_model(str(tiny_model_dir), "bfloat16")
    initial = {k: v.detach().clone() for k, v in model.named_parameters()}
    actor = SingleActor(model, OptimConfig(lr=1e-6, weight_decay=0.0))
    g = torch.Generator().manual_seed(0)
    samples = [TrainSample.from_turn(torch.randint(5, 200, (6,), generator=g).tolist(),
                                     torch.randint(5, 200, (3,), generator=g).tolist()) for _ in range(4)]

    def step():
        def loss_fn(batch):
            logp, _ = actor.token_logprobs(batch)
            return LossOutputs(-logp.float().mean())
        return actor.optimizer_step([(micro_batches(samples, 10**6), loss_fn)])

    for _ in range(3):
        assert step().counts["skipped_updates"] == 0
    names = [k for k, p in model.named_parameters() if p.requires_grad]
    assert all(m.dtype == torch.float32 for m in actor.master)
    moved = sum(float((m.detach() - initial[k].float()).abs().max()) > 2e-6 for k, m in zip(names, actor.master))
    assert moved == len(names)  # every master weight took its ~3e-6 of steps
    assert all(torch.equal(p, m.to(torch.bfloat16)) for p, m in zip(actor.parameters, actor.master))

    actor.save(tmp_path)
    step()
    after = [m.clone() for m in actor.master]
    reloaded = SingleActor(load_model(str(tmp_path / "model"), "bfloat16"), OptimConfig(lr=1e-6, weight_decay=0.0))
    reloaded.load(tmp_path)
    actor = reloaded
    step()
    assert all(torch.equal(a, m) for a, m in zip(after, actor.master))  # the fp32 state, not the bf16 weights


def test_a_resume_mid_warmup_continues_the_schedule(tiny_model_dir, tmp_path):
    """Saved after the first of 5 warmup steps and reloaded, the actor takes the next steps at the
    learning rates and to the weights the uninterrupted one does: the schedule's place is saved."""
    from agentrl.packing import micro_batches

    optim = OptimConfig(lr=1e-3, weight_decay=0.0, warmup_steps=5)
    g = torch.Generator().manual_seed(0)
    samples = [TrainSample.from_turn(torch.randint(5, 200, (6,), generator=g).tolist(),
                                     torch.randint(5, 200, (3,), generator=g).tolist()) for _ in range(4)]

    def steps(actor, n):
        def loss_fn(batch):
            logp, _ = actor.token_logprobs(batch)
            return LossOutputs(-logp.float().mean())
        return [actor.optimizer_step([(micro_batches(samples, 10**6), loss_fn)]).report(1, 1)["lr"] for _ in range(n)]

    actor = SingleActor(load_model(str(tiny_model_dir)), optim)
    assert steps(actor, 1) == pytest.approx([2e-4])
    actor.save(tmp_path)
    straight = steps(actor, 3)
    resumed = SingleActor(load_model(str(tmp_path / "model")), optim)
    resumed.load(tmp_path)
    assert straight == pytest.approx([4e-4, 6e-4, 8e-4]) and steps(resumed, 3) == straight
    assert all(torch.equal(a, b) for a, b in zip(actor.parameters, resumed.parameters))


def test_a_non_finite_step_is_skipped_whole(tiny_model_dir):
    """A NaN loss gives a NaN gradient norm: the single actor leaves the weights, the optimiser's
    moments and the schedule as they were and counts the step skipped; the next finite step
    takes the learning rate the skipped one would have."""
    optim = OptimConfig(lr=1e-3, weight_decay=0.0, warmup_steps=5)
    g = torch.Generator().manual_seed(0)
    samples = [TrainSample.from_turn(torch.randint(5, 200, (6,), generator=g).tolist(),
                                     torch.randint(5, 200, (3,), generator=g).tolist()) for _ in range(4)]
    actor = SingleActor(load_model(str(tiny_model_dir)), optim)

    def step(scale):
        def loss_fn(batch):
            logp, _ = actor.token_logprobs(batch)
            return LossOutputs(-logp.float().mean() * scale)
        return actor.optimizer_step([(micro_batches(samples, 10**6), loss_fn)]).report(1, 1)

    before = [p.detach().clone() for p in actor.parameters]
    skipped = step(float("nan"))
    assert skipped["skipped_updates"] == 1 and skipped["lr"] == pytest.approx(2e-4)
    assert all(torch.equal(a, b) for a, b in zip(before, actor.parameters))
    assert not actor.optimizer.state
    taken = step(1.0)
    assert taken["skipped_updates"] == 0 and taken["lr"] == pytest.approx(2e-4)
    assert not all(torch.equal(a, b) for a, b in zip(before, actor.parameters))


def test_shared_prefill_generates_what_separate_prefills_generate(tiny_model_dir):
    """Prompts prefilled as a prefix tree: every sample gets the tokens and log-probs it gets when
    each prompt is prefilled on its own (sampled and greedy), and each distinct leading part of
    the prompts (but their last tokens) is run once: the prompts that start as `a` in one row,
    the two `b`s, which share nothing with them, in a row of their own (cheaper than a longer
    shared row: `Packing`), padded to the first's width."""
    tokenizer, model = load_tokenizer(tiny_model_dir), load_model(tiny_model_dir)
    a = tokenizer("Task: put a apple in shelf.\nObservation: You arrive at desk 1.").input_ids
    b = tokenizer("Actions: go to desk 1, look").input_ids
    prompts = [a, b, a, a, b, a[:7], a, a[:9] + b]
    a_tree = len({tuple(p[:i]) for p in prompts if p[0] == a[0] for i in range(1, len(p))})
    embedded = []
    hook = model.get_input_embeddings().register_forward_hook(lambda m, i, o: embedded.append(i[0].numel()))
    for temperature in (1.0, 0.0):
        out, runs = {}, {}
        for share in (False, True):
            torch.manual_seed(0)
            embedded.clear()
            out[share] = HFSampler(model, tokenizer, share).generate(prompts, SamplingConfig(temperature=temperature,
                                                                                             max_new_tokens=12))
            runs[share] = sum(embedded)
        for plain, shared in zip(out[False], out[True]):
            assert shared.token_ids == plain.token_ids
            torch.testing.assert_close(torch.tensor(shared.logprobs), torch.tensor(plain.logprobs), atol=1e-5, rtol=0)
        # unshared: the padded prompts, then the new tokens; shared: the tree (two rows), the
        # prompts' last tokens, then the same new tokens
        assert runs[True] - 2 * a_tree - len(prompts) == runs[False] - len(prompts) * max(map(len, prompts))
    hook.remove()


def test_each_distinct_prompt_is_read_once_per_decoding_step(tiny_model_dir):
    """The decoder keeps each distinct prompt's cache once, met by the queries of all its samples
    (split in groups of `QUERIES` query heads), and samples what `generate` samples, with its
    temperature and nucleus warpers, rows ending at different steps: 20 copies of one prompt
    (three groups at the tiny model's 2 query heads per key head), 3 of another, one alone."""
    tokenizer, model = load_tokenizer(tiny_model_dir), load_model(tiny_model_dir)
    a = tokenizer("Task: put a apple in shelf.\nObservation: You arrive at desk 1.").input_ids
    b = tokenizer("Actions: go to desk 1, look").input_ids
    prompts = [a] * 12 + [b] * 3 + [a] * 8 + [a[:6]]
    prefixes = [a[:-1], b[:-1], a[:5]]
    owner = [0] * 12 + [1] * 3 + [0] * 8 + [2]
    states = shared_decode.tree_prefill(model, prefixes, Packing.for_model(model.config), tokenizer.pad_token_id)
    cache = shared_decode.PrefixCache(model, states, owner)
    per = shared_decode.QUERIES // (model.config.num_attention_heads // model.config.num_key_value_heads)
    assert per == 8 and [len(k) for k in cache.keys] == [3 + 1 + 1] * model.config.num_hidden_layers
    assert sorted(cache.slot[cache.slot < len(prompts)].tolist()) == list(range(len(prompts)))  # each sample once
    params = SamplingConfig(temperature=0.7, top_p=0.9, max_new_tokens=16)
    torch.manual_seed(0)
    drawn = [t for g in HFSampler(model, tokenizer, False).generate(prompts, params) for t in g.token_ids]
    out = {}
    for share in (False, True):
        sampler = HFSampler(model, tokenizer, share)
        sampler.eos_id = max(set(drawn), key=drawn.count)  # a common token ends rows at different steps
        torch.manual_seed(0)
        out[share] = sampler.generate(prompts, params)
    assert len({len(g.token_ids) for g in out[True]}) > 3  # rows left the batch at several steps
    assert len({tuple(g.token_ids) for g in out[True]}) > 3  # copies of a prompt sampled apart
    for plain, shared in zip(out[False], out[True]):
        assert shared.token_ids == plain.token_ids
        torch.testing.assert_close(torch.tensor(shared.logprobs), torch.tensor(plain.logprobs), atol=1e-5, rtol=0)


def test_shared_decoding_matches_generate_on_smollm2(smollm2_dir):
    """A pretrained Llama-family model with grouped-query attention (SmolLM2-135M-Instruct: 9 query
    heads on 3 key heads, 30 layers): the shared-prefix decoder samples `generate`'s tokens,
    greedy and nucleus-sampled, 3 observations x 4 rollouts of one task."""
    from agentrl.prompting import encode_prompt

    folder = smollm2_dir
    tokenizer, model = load_tokenizer(str(folder)), load_model(str(folder))
    assert shared_decode.supports(model) and model.config.model_type == "llama"
    task = "You are in a kitchen. Your task is to put a clean mug in the coffee machine."
    prompts = [encode_prompt(tokenizer, f"{task}\nObservation: {seen}\nWhat do you do next? Answer with one action.")
               for seen in ["You see a mug on the counter.", "You are holding the mug.", "The sink is empty."]
               for _ in range(4)]
    for params in (SamplingConfig(temperature=0.0, max_new_tokens=16),
                   SamplingConfig(temperature=0.7, top_p=0.9, max_new_tokens=16)):
        out = {}
        for share in (False, True):
            torch.manual_seed(0)
            out[share] = HFSampler(model, tokenizer, share).generate(prompts, params)
        for plain, shared in zip(out[False], out[True]):
            assert shared.token_ids == plain.token_ids
            torch.testing.assert_close(torch.tensor(shared.logprobs), torch.tensor(plain.logprobs), atol=5e-5, rtol=0)


def test_every_backends_optimiser_is_adamw_with_the_recipes_settings_by_hand():
    """`make_optimizer` (every backend's): the learning rate ramps linearly over warmup_steps from
    lr / warmup at the first step, and each step is AdamW's with the recipe's betas and decoupled
    weight decay, computed here by hand."""
    from agentrl.actor.base import make_optimizer

    optim = OptimConfig(lr=0.1, betas=(0.5, 0.8), weight_decay=0.3, warmup_steps=4)
    param = torch.nn.Parameter(torch.tensor([1.0, -2.0]))
    optimizer, scheduler = make_optimizer([param], optim)
    grads = [torch.tensor([0.5, 1.0]), torch.tensor([-1.0, 2.0]), torch.tensor([0.25, -0.5]),
             torch.tensor([1.0, 1.0]), torch.tensor([-2.0, 0.5]), torch.tensor([0.5, 0.5])]
    expected, m, v, eps = param.detach().clone().double(), 0.0, 0.0, 1e-8
    lrs = []
    for t, grad in enumerate(grads, start=1):
        lr = 0.1 * min(1.0, t / 4)
        lrs.append(scheduler.get_last_lr()[0])
        param.grad = grad.clone()
        optimizer.step()
        scheduler.step()
        g = grad.double()
        expected = expected * (1 - lr * 0.3)
        m, v = 0.5 * m + 0.5 * g, 0.8 * v + 0.2 * g * g
        expected = expected - lr * (m / (1 - 0.5 ** t)) / ((v / (1 - 0.8 ** t)).sqrt() + eps)
        torch.testing.assert_close(param.detach().double(), expected, atol=1e-6, rtol=0)
    assert lrs == pytest.approx([0.025, 0.05, 0.075, 0.1, 0.1, 0.1])


def test_the_shared_decoder_pads_a_row_after_its_end(tiny_model_dir):
    """A row that sampled its end token gives `pad_id` at every later step (as `generate` does)
    while the other rows go on sampling: its later draws are discarded, not returned."""
    tokenizer, model = load_tokenizer(tiny_model_dir), load_model(tiny_model_dir)
    prompts = [tokenizer(text).input_ids for text in ("Task: put a apple in shelf.", "Observation: You arrive at desk 1.",
                                                      "Actions: go to desk 1, look", "Observation: Nothing happens.")]
    params, pack, pad = SamplingConfig(temperature=1.0, max_new_tokens=8), Packing.for_model(model.config), 1
    torch.manual_seed(0)
    free, _ = shared_decode.generate(model, prompts, params, eos_id=-1, pad_id=pad, pack=pack)
    end = int(free[0, 1])  # row 0's second token, taken as the end token: row 0 ends at its second step
    torch.manual_seed(0)
    tokens, _ = shared_decode.generate(model, prompts, params, eos_id=end, pad_id=pad, pack=pack)
    assert tokens.shape[1] > 2 and tokens[0, :2].tolist() == free[0, :2].tolist()
    for row in tokens.tolist():
        if end in row:
            assert row[row.index(end) + 1:] == [pad] * (len(row) - row.index(end) - 1)
