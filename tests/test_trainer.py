import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from agentrl.config import validate_config
from agentrl.checkpoint import list_checkpoints
from agentrl.tracking import read_metrics
from agentrl.trainer import RLTrainer

from conftest import COMPACT


def small_config(run_dir, steps, **rl):
    return validate_config({
        "seed": 3, "run_dir": str(run_dir),
        "env": {"type": "household", "max_steps": 3},
        "prompt": {"template": COMPACT, "history_length": 1},
        "sampling": {"max_new_tokens": 8},
        "rl": {"steps": steps, "tasks_per_step": 2, "group_size": 3, "mini_batch_size": 8,
               "micro_batch_tokens": 600, "save_every": 1, "kl_coef": 0.01, "optim": {"lr": 1e-3}, **rl},
        "eval": {"episodes": 2, "splits": ["l0"]},
    })


def run(config, model_dir, resume=False):
    trainer = RLTrainer(config, str(model_dir), Path(config.run_dir))
    try:
        trainer.run(resume=resume)
    finally:
        trainer.close()


def strip_timing(rows):
    return [{k: v for k, v in r.items() if not k.startswith(("timing_s/", "eval/"))} for r in rows]


def test_resume_continues_exactly_like_an_uninterrupted_run(tiny_model_dir, tmp_path):
    straight = tmp_path / "straight"
    run(small_config(straight, 3), tiny_model_dir)

    split = tmp_path / "split"
    run(small_config(split, 2), tiny_model_dir)
    # Simulate a crash after step 2's checkpoint: a later, stale metrics line must not survive.
    with (split / "logs" / "metrics.jsonl").open("a") as f:
        f.write(json.dumps({"step": 3, "stale": 1.0}) + "\n")
    run(small_config(split, 3), tiny_model_dir, resume=True)

    final_a = load_file(list_checkpoints(straight)[-1] / "model" / "model.safetensors")
    final_b = load_file(list_checkpoints(split)[-1] / "model" / "model.safetensors")
    for name in final_a:
        assert torch.equal(final_a[name], final_b[name]), name
    rows_a = strip_timing(read_metrics(straight / "logs" / "metrics.jsonl"))
    rows_b = strip_timing(read_metrics(split / "logs" / "metrics.jsonl"))
    assert [r["step"] for r in rows_b] == [1, 2, 3]
    assert rows_a == rows_b
    assert len(list_checkpoints(split)) == 2  # keep_last


def test_training_changes_the_weights_and_logs_namespaced_metrics(tiny_model_dir, tmp_path):
    config = small_config(tmp_path, 1)
    trainer = RLTrainer(config, str(tiny_model_dir), tmp_path)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    try:
        metrics = trainer.train_step()
    finally:
        trainer.close()
    changed = [n for n, p in trainer.model.named_parameters() if not torch.equal(before[n], p)]
    assert changed
    for key in ["rollout/success", "rollout/invalid_rate", "rollout/repeated_rate", "actor/pg_clipfrac",
                "actor/kl", "actor/entropy", "actor/grad_norm", "tokens/processed", "timing_s/gen",
                "timing_s/env", "timing_s/update", "adv/iqr"]:
        assert key in metrics, key
    assert metrics["rollout/length"] == 3.0  # untrained model: every episode runs to max_steps


def test_aux_loss_joins_the_update(tiny_model_dir, tmp_path):
    from agentrl.config import PromptConfig
    from agentrl.data import collect_expert_data
    from agentrl.envs.household import HouseholdEnv

    collect_expert_data(HouseholdEnv(), PromptConfig(template=COMPACT, history_length=1), 2, tmp_path / "j.jsonl", 0)
    config = small_config(tmp_path, 1, aux=[{"type": "chat_sft", "name": "judge", "data": str(tmp_path / "j.jsonl"),
                                            "batch_size": 4, "weight": 0.5}])
    trainer = RLTrainer(config, str(tiny_model_dir), tmp_path)
    try:
        metrics = trainer.train_step()
    finally:
        trainer.close()
    assert metrics["aux/judge/loss"] > 0


def test_kl_as_reward_penalty(tiny_model_dir, tmp_path):
    config = small_config(tmp_path / "run", 2, kl_in_reward=True, kl_coef=0.5, kl_estimator="k1")
    run(config, tiny_model_dir)
    rows = read_metrics(tmp_path / "run" / "logs" / "metrics.jsonl")
    assert abs(rows[0]["rollout/kl_penalty"]) < 1e-6  # step 1 samples from the reference itself (0 on CPU)
    assert rows[1]["rollout/kl_penalty"] != 0.0
    assert "actor/kl" not in rows[1]  # not also a loss term


def test_ppo_critic_learns_and_resumes_exactly(tiny_model_dir, tmp_path):
    ppo = {"advantage": {"type": "ppo", "critic_lr": 1e-3}}
    straight = tmp_path / "straight"
    run(small_config(straight, 3, **ppo), tiny_model_dir)
    rows = read_metrics(straight / "logs" / "metrics.jsonl")
    assert rows[0]["critic/value_mean"] == 0.0  # zero-initialised head
    assert rows[-1]["critic/value_mean"] != 0.0
    assert all(r["critic/value_loss"] > 0 for r in rows)
    assert (list_checkpoints(straight)[-1] / "critic" / "critic.safetensors").is_file()

    split = tmp_path / "split"
    run(small_config(split, 2, **ppo), tiny_model_dir)
    run(small_config(split, 3, **ppo), tiny_model_dir, resume=True)
    critic_a = load_file(list_checkpoints(straight)[-1] / "critic" / "critic.safetensors")
    critic_b = load_file(list_checkpoints(split)[-1] / "critic" / "critic.safetensors")
    for name in critic_a:
        assert torch.equal(critic_a[name], critic_b[name]), name
    assert strip_timing(rows) == strip_timing(read_metrics(split / "logs" / "metrics.jsonl"))


def test_critic_regresses_to_its_targets(tiny_model_dir):
    import random

    from agentrl.config import PPOConfig
    from agentrl.critic import Critic

    critic = Critic(str(tiny_model_dir), PPOConfig(critic_lr=3e-3, value_clip=100.0))
    prompts, targets = [[5, 6, 7, 8], [9, 10, 11]], [1.0, -2.0]
    assert critic.values(prompts, 100) == [0.0, 0.0]
    for _ in range(60):
        critic.update(prompts, targets, critic.values(prompts, 100), 2, 100, random.Random(0))
    assert critic.values(prompts, 100) == pytest.approx(targets, abs=0.1)
    # Value clipping: V = 0 lies beyond V_old +- 0.05 (V_old = -1 and 1, on the far side from the
    # targets), so the clipped error dominates: 0.5 x mean(1.95^2, 2.95^2), no gradient, V stays 0.
    clipped = Critic(str(tiny_model_dir), PPOConfig(critic_lr=3e-3, value_clip=0.05))
    metrics = clipped.update(prompts, targets, [-1.0, 1.0], 2, 100, random.Random(0))
    assert metrics["value_loss"] == pytest.approx(0.5 * (1.95 ** 2 + 2.95 ** 2) / 2)
    assert metrics["value_clipfrac"] == 1.0 and metrics["grad_norm"] == 0.0
    assert clipped.values(prompts, 100) == [0.0, 0.0]


def test_nthr_runs_inside_the_update(tiny_model_dir, tmp_path):
    config = small_config(tmp_path, 1, nthr={"tau": 1.0, "eta": 0.5})
    trainer = RLTrainer(config, str(tiny_model_dir), tmp_path)
    try:
        metrics = trainer.train_step()
    finally:
        trainer.close()
    assert 0.0 <= metrics["nthr/downweighted_share"] <= 1.0 and "timing_s/nthr" in metrics
    assert "timing_s/advantage" in metrics


def test_coupling_lab_runs_inside_training(tiny_model_dir, tmp_path):
    config = small_config(tmp_path, 1, coupling_every=1)
    trainer = RLTrainer(config, str(tiny_model_dir), tmp_path)
    try:
        metrics = trainer.train_step()
    finally:
        trainer.close()
    assert "timing_s/coupling" in metrics


def test_vllm_sampler_without_vllm_names_the_fix(tiny_model_dir, tmp_path):
    import importlib.util
    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vllm is installed (tests/test_vllm.py covers it)")
    with pytest.raises(ImportError, match=r"rl\.sampler\.type: vllm needs vLLM.*make vllm-env"):
        RLTrainer(small_config(tmp_path, 1, sampler={"type": "vllm"}), str(tiny_model_dir), tmp_path)
