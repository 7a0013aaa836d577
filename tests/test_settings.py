"""Every setting an RL step reads does what its documentation says, by construction: each field
of `rl` (its own and its sections': the optimiser, the default loss, actor, sampler and estimator,
the environment pool, the rollout loop), `sampling` and `prompt` is in one of three tables, and a
field added later fails `test_every_setting_of_a_step_is_in_one_table` until it is put in one.

- CHANGES: another value changes the policy one step leaves (with what both runs need for the
  difference to show): a setting read nowhere, or read and then dropped, fails.
- KEEPS: another value leaves it as it was, bit for bit or, where the documentation says so, up to
  float summation order: settings of how a step is computed, not what.
- ELSEWHERE: what it changes is not the policy one step leaves (outputs, faults, the number of
  steps, other processes, data for SFT), or not on this task: the test that checks what it does,
  which must exist and name the setting.

An RL step here is the two-step task (`twostep.py`) played by a policy that picks either action about
half the time, so returns differ within each task group, trained in four mini-batches, so that from
the second on the policy is off its reference and its old log-probs, and the clip ranges, the KL and
Adam's later steps all act. An SFT is the tiny model trained on that task's data (either action
in every state) in four optimiser steps. What is compared is the policy's logits on one prompt and
reply."""

import ast
import copy
import re
from pathlib import Path

import pytest
import torch
import twostep

from agentrl.config import Section
from agentrl.models import load_model, load_tokenizer
from agentrl.recipe import validate_config
from agentrl.registry import ADVANTAGES, POLICY_LOSSES
from agentrl.sft import train_sft
from agentrl.trainer import RLTrainer

BASE = {
    "seed": 7, "env": {"type": "twostep"},
    "prompt": {"template": twostep.TEMPLATE, "history_length": 1},
    "sampling": {"max_new_tokens": 24, "temperature": 1.0},
    "rl": {"steps": 1, "tasks_per_step": 2, "group_size": 4, "mini_batch_size": 4, "micro_batch_tokens": 4096,
           "kl_coef": 0.05, "optim": {"lr": 3e-4, "weight_decay": 0.0}},
    "sft": {"epochs": 1, "batch_size": 8, "optim": {"lr": 1e-3, "weight_decay": 0.0}},
}
SECTIONS = ("rl", "sampling", "prompt", "sft")
VARIANTS = {"rl.advantage": ADVANTAGES, "rl.loss": POLICY_LOSSES}
"""Sections whose every built-in type is enumerated too, as `rl.advantage[gigpo].gamma` (not the
types other tests register in the same process)."""

CHANGES = {  # setting: (another value, settings both runs need)
    "rl.tasks_per_step": (1, {}),
    "rl.group_size": (2, {}),
    "rl.mini_batch_size": (16, {}),
    "rl.mini_batch_order": ("grouped", {}),
    "rl.epochs": (2, {}),
    "rl.loss_agg": ("seq-mean-token-sum", {}),
    "rl.kl_estimator": ("k1", {}),
    "rl.kl_coef": (0.5, {}),
    "rl.kl_in_reward": (True, {}),
    "rl.entropy_coef": (0.1, {}),
    "rl.tis_cap": (0.5, {"rl.old_logprobs": "actor"}),
    "rl.advantage.type": ("rloo", {}),
    "rl.advantage.normalize_std": (False, {}),
    "rl.advantage.eps": (1.0, {}),
    "rl.loss.type": ("seq_ratio", {}),
    "rl.loss.clip_low": (0.005, {}),
    "rl.loss.clip_high": (0.005, {}),
    "rl.loss.dual_clip": (1.01, {"rl.loss.clip_high": 10.0}),
    "rl.loss[seq_ratio].clip_low": (0.005, {"rl.loss[seq_ratio].dual_clip": None}),
    "rl.loss[seq_ratio].clip_high": (0.005, {"rl.loss[seq_ratio].dual_clip": None}),
    "rl.loss[seq_ratio].dual_clip": (1.0001, {"rl.loss[seq_ratio].clip_high": 10.0}),
    "rl.advantage[gigpo].gamma": (0.5, {"rl.advantage[gigpo].step_std": False}),
    "rl.advantage[gigpo].step_weight": (-1.0, {}),
    "rl.advantage[gigpo].step_std": (False, {}),
    "rl.advantage[gigpo].episode_std": (False, {}),
    "rl.advantage[gigpo].eps": (1.0, {}),
    "rl.advantage[gagpo].gamma": (0.5, {}),
    "rl.advantage[gagpo].lam": (0.3, {}),
    "rl.advantage[gagpo].normalize_std": (False, {}),
    "rl.advantage[gagpo].eps": (1.0, {}),
    "rl.advantage[ppo].gamma": (0.5, {}),
    "rl.advantage[ppo].lam": (0.5, {}),
    "rl.advantage[ppo].normalize": (False, {}),
    "rl.advantage[ppo].eps": (1.0, {}),
    "rl.advantage[rlvmr].normalize_std": (False, {}),
    "rl.advantage[rlvmr].eps": (1.0, {}),
    "rl.optim.lr": (1e-3, {}),
    "rl.optim.weight_decay": (0.5, {}),
    "rl.optim.betas": ((0.5, 0.9), {}),
    "rl.optim.grad_clip": (1e-6, {}),
    "rl.optim.warmup_steps": (2, {}),
    "rl.actor.lora": ({"r": 4}, {}),
    "sampling.temperature": (0.7, {}),
    "sampling.top_p": (0.5, {}),
    "sampling.max_new_tokens": (8, {}),
    "prompt.template": (twostep.TEMPLATE.replace("Task:", "Goal:"), {}),
    "prompt.history_length": (0, {}),
    "prompt.full_history": (True, {}),
    "prompt.turn_template": ("Now: {observation}\nActions: {actions}", {"prompt.full_history": True}),
    "sft.epochs": (2, {}),
    "sft.batch_size": (16, {}),
    "sft.prompt_loss_weight": (0.5, {}),
    "sft.optim.lr": (3e-4, {}),
    "sft.optim.weight_decay": (0.5, {}),
    "sft.optim.betas": ((0.5, 0.9), {}),
    "sft.optim.grad_clip": (1e-6, {}),
    "sft.optim.warmup_steps": (2, {}),
    "sft.actor.lora": ({"r": 4}, {}),
}

FLOAT_ORDER = 1e-3  # of the step's own change: what float summation order may move a weight by

KEEPS = {  # setting: (another value, bit for bit?)
    "rl.micro_batch_tokens": (64, False),
    "rl.pack_prefixes": (False, False),
    "rl.check_logprobs_every": (0, True),
    "rl.old_logprobs": ("actor", False),  # the sampler here is the policy itself, in fp32
    "rl.actor.activation_checkpointing": (True, False),
    "rl.sampler.share_prefixes": (False, False),
    "rl.sampler.keep_cache_mib": (64.0, True),
    "sft.micro_batch_tokens": (64, False),
    "sft.pack_prefixes": (True, False),
    "sft.save_every": (1, True),
    "sft.actor.activation_checkpointing": (True, False),
}

ELSEWHERE = {
    "rl.steps": "test_trainer.py::test_steps_save_every_keep_last_and_eval_every_decide_the_checkpoints_and_evaluations",
    "rl.balance_task_types": "test_trainer.py::test_balance_task_types_draws_each_steps_tasks_a_type_at_a_time",
    "rl.train_task_types": "test_alfworld.py::test_rl_train_task_types_replace_the_envs_for_rl_only",
    "rl.advantage.level": "test_advantages.py::test_grpo_step_level_by_hand_with_two_task_groups",
    "rl.advantage[rlvmr].level": "test_advantages.py::test_rlvmr_without_meta_tags_is_grpo_with_its_own_level_and_normalisation",
    "rl.advantage[rlvmr].meta_weight": "test_advantages.py::test_rlvmr_by_hand",
    "rl.advantage[rlvmr].planning_reward": "test_advantages.py::test_rlvmr_by_hand",
    "rl.advantage[rlvmr].explore_reward": "test_advantages.py::test_rlvmr_by_hand",
    "rl.advantage[rlvmr].reflection_reward": "test_advantages.py::test_rlvmr_by_hand",
    "rl.advantage[ppo].critic_path": "test_trainer.py::test_critic_path_is_the_critics_body",
    "rl.advantage[ppo].critic_lr": "test_trainer.py::test_critic_regresses_to_its_targets",
    "rl.advantage[ppo].critic_weight_decay": "test_trainer.py::test_the_critics_own_settings_each_change_its_update",
    "rl.advantage[ppo].critic_grad_clip": "test_trainer.py::test_the_critics_own_settings_each_change_its_update",
    "rl.advantage[ppo].critic_epochs": "test_trainer.py::test_ppo_critic_regresses_onto_the_step_returns",
    "rl.advantage[ppo].value_clip": "test_trainer.py::test_critic_regresses_to_its_targets",
    "rl.actor.backend": "test_distributed.py::test_two_ranks_match_one_process",
    "rl.sampler.type": "test_vllm.py::test_vllm_sampler_in_the_trainer_reproduces_and_resumes",
    "rl.aux": "test_trainer.py::test_aux_loss_joins_the_update",
    "rl.components": "test_trainer.py::test_nthr_runs_inside_the_update",
    "rl.eval_every": "test_trainer.py::test_steps_save_every_keep_last_and_eval_every_decide_the_checkpoints_and_evaluations",
    "rl.save_every": "test_trainer.py::test_steps_save_every_keep_last_and_eval_every_decide_the_checkpoints_and_evaluations",
    "rl.keep_last": "test_trainer.py::test_steps_save_every_keep_last_and_eval_every_decide_the_checkpoints_and_evaluations",
    "rl.save_rollouts": "test_trainer.py::test_resume_continues_exactly_like_an_uninterrupted_run",
    "rl.log_samples": "test_trainer.py::test_log_samples_shows_that_many_episodes_last_turns_a_task_group_at_a_time",
    "rl.env_pool.backend": "test_ray_pool.py::test_a_training_step_on_ray_actors_survives_a_killed_actor",
    "rl.env_pool.workers": "test_pool.py::test_worker_processes_match_in_process",
    "rl.env_pool.step_timeout_s": "test_ray_pool.py::test_an_actor_killed_or_hung_mid_step_aborts_exactly_its_episodes",
    "rl.env_pool.reset_timeout_s": "test_pool.py::test_a_tried_move_or_expert_question_is_timed_and_named_by_the_step_limit",
    "rl.env_pool.ray.address": "test_ray_pool.py::test_a_ray_address_nothing_answers_at_exits_2_at_once_naming_it",
    "rl.env_pool.ray.num_cpus": "test_ray_pool.py::test_each_ray_worker_reserves_its_cpus_and_memory",
    "rl.env_pool.ray.memory_gib": "test_ray_pool.py::test_each_ray_worker_reserves_its_cpus_and_memory",
    "rl.rollout.mode": "test_rollout_modes.py::test_async_plays_the_same_episodes_as_lockstep",
    "rl.rollout.batch_window_s": "test_rollout_modes.py::test_async_plays_the_same_episodes_as_lockstep",
    "rl.rollout.filter_groups": "test_trainer.py::test_filter_groups_draws_more_tasks_and_trains_only_groups_whose_returns_differ",
    "rl.overlap": "test_overlap.py::test_staleness_0_plays_the_in_process_runs_samples_and_1_samples_each_step_with_the_weights_it_records",
    "rl.max_aborted_share": "test_failures.py::test_a_run_whose_episodes_all_abort_stops_naming_the_timeout",
    "rl.max_skipped_updates": "test_failures.py::test_non_finite_updates_are_skipped_counted_and_stop_the_run",
    "sampling.retries": "test_rollout_modes.py::test_retries_resample_until_the_action_is_admissible",
    "prompt.require_think": "test_prompting.py::test_invalid_forms",
    "prompt.expert_tags": "test_sft.py::test_expert_data_with_rlvmr_meta_tags",
    "prompt.invalid_penalty": "test_trainer.py::test_kl_in_reward_adds_each_actions_kl_to_its_penalty",
    "sft.actor.backend": "test_distributed.py::test_sharded_sft_matches_one_process_and_resumes_exactly_after_a_kill",
    "sft.episodes": "test_cli.py::test_data_from_a_recipe_without_sft_or_rl_sections",
    "sft.data": "test_cli.py::test_what_sft_on_given_data_depends_on",
    "sft.judgments": "test_gcd.py::test_judgment_data_is_balanced_and_parseable",
    "sft.detours": "test_sft.py::test_detours_teach_recovery_with_the_experts_labels",
    "sft.keep_failed": "test_testbed.py::test_a_random_key_demonstrator_is_imitated_mistakes_included",
    "sft.dagger": "test_dagger.py::test_pipeline_rounds_aggregate_every_label_and_are_reused",
}


def settings_of(section: Section, prefix: str) -> list[str]:
    """The dotted name of every field of `section` that is not itself a section."""
    names = []
    for name in type(section).model_fields:
        value = getattr(section, name)
        names += settings_of(value, f"{prefix}{name}.") if isinstance(value, Section) else [f"{prefix}{name}"]
    return names


def test_every_setting_of_a_step_is_in_one_table():
    config = validate_config(BASE)
    settings = [name for section in SECTIONS for name in settings_of(getattr(config, section), f"{section}.")]
    for section, registry in VARIANTS.items():
        default = getattr(config.rl, section.split(".")[1]).type
        built_in = [kind for kind in registry.names() if registry.entry(kind).config.__module__.startswith("agentrl.")]
        settings += [name for kind in built_in if kind != default
                     for name in settings_of(registry.make(kind), f"{section}[{kind}].") if not name.endswith(".type")]
    tables = [*CHANGES, *KEEPS, *ELSEWHERE]
    assert sorted(tables) == sorted(set(tables)), "a setting in two tables"
    assert sorted(settings) == sorted(tables)


@pytest.mark.parametrize("setting", sorted(ELSEWHERE))
def test_a_setting_checked_elsewhere_names_a_test_that_exists(setting):
    file, name = ELSEWHERE[setting].split("::")
    source = (Path(__file__).parent / file).read_text()
    [test] = [node for node in ast.parse(source).body if isinstance(node, ast.FunctionDef) and node.name == name]
    field = re.sub(r"\[.*?\]", "", setting).split(".")[-1]
    assert field in ast.get_source_segment(source, test), f"{ELSEWHERE[setting]} never names {field}"


def with_settings(run_dir: Path, settings: dict):
    """The config of BASE with dotted settings put in (`rl.advantage[gigpo].gamma`: of that type)."""
    recipe = {**copy.deepcopy(BASE), "run_dir": str(run_dir)}
    for dotted, value in settings.items():
        *sections, name = dotted.split(".")
        inner = recipe
        for section in sections:
            section, _, kind = section.rstrip("]").partition("[")
            inner = inner.setdefault(section, {})
            if kind:
                inner["type"] = kind
        inner[name] = value
    return validate_config(recipe)


def probe_logits(model, tokenizer) -> torch.Tensor:
    """The model's logits on the task's first prompt and a reply (logits, not weights: LoRA trains
    other parameters than the full model's)."""
    probe = tokenizer(twostep.first_prompt() + twostep.response(twostep.GOOD), return_tensors="pt").input_ids
    with torch.no_grad():
        return model(probe).logits


def step_logits(model_dir, run_dir, settings: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """The policy's probe logits before and after one RL step with `settings`."""
    trainer = RLTrainer(with_settings(run_dir, settings), str(model_dir), run_dir)
    try:
        before = probe_logits(trainer.model, trainer.tokenizer)
        trainer.train_step()
        return before, probe_logits(trainer.model, trainer.tokenizer)
    finally:
        trainer.close()


def sft_logits(model_dir, run_dir, settings: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """The probe logits of the model before and after SFT with `settings` on the two-step task's
    data (either action in every state)."""
    config = with_settings(run_dir, settings)
    model, tokenizer = load_model(model_dir), load_tokenizer(model_dir)
    before = probe_logits(model, tokenizer)
    twostep.write_choice_data(run_dir / "data.jsonl")
    out = train_sft(model, tokenizer, run_dir / "data.jsonl", config.sft, config.seed, run_dir / "sft")
    return before, probe_logits(load_model(out), tokenizer)


def trained_logits(tiny_model_dir, choice_model_dir, run_dir, settings: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """An SFT from the tiny model where a setting of `sft` is tried, else an RL step from the
    choice model."""
    if any(name.startswith("sft.") for name in settings):
        return sft_logits(tiny_model_dir, run_dir, settings)
    return step_logits(choice_model_dir, run_dir, settings)


@pytest.fixture(scope="module")
def base_step(tiny_model_dir, choice_model_dir, tmp_path_factory):
    """The probe logits before and after training with BASE and the settings both runs need
    (`sft`: `{"sft": True}`)."""
    cache = {}

    def logits(context: dict, sft: bool):
        key = repr((sorted(context.items()), sft))
        if key not in cache:
            run_dir = tmp_path_factory.mktemp("base")
            cache[key] = (sft_logits(tiny_model_dir, run_dir, context) if sft
                          else step_logits(choice_model_dir, run_dir, context))
        return cache[key]
    return logits


def largest(difference: torch.Tensor) -> float:
    return difference.abs().max().item()


@pytest.mark.parametrize("setting", sorted(CHANGES))
def test_another_value_of_a_setting_changes_the_step(setting, base_step, tiny_model_dir, choice_model_dir, tmp_path):
    other, context = CHANGES[setting]
    before, after = base_step(context, setting.startswith("sft."))
    _, changed = trained_logits(tiny_model_dir, choice_model_dir, tmp_path, {**context, setting: other})
    assert largest(changed - after) > FLOAT_ORDER * largest(after - before), (largest(changed - after), largest(after - before))


@pytest.mark.parametrize("setting", sorted(KEEPS))
def test_another_value_of_a_setting_of_how_a_step_is_computed_keeps_the_step(setting, base_step, tiny_model_dir,
                                                                              choice_model_dir, tmp_path):
    other, exact = KEEPS[setting]
    before, after = base_step({}, setting.startswith("sft."))
    _, kept = trained_logits(tiny_model_dir, choice_model_dir, tmp_path, {setting: other})
    assert largest(kept - after) <= (0 if exact else FLOAT_ORDER * largest(after - before)), (largest(kept - after), largest(after - before))
