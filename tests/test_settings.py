"""Every setting of a recipe does what its documentation says, by construction: each field of
every section (the built-in types of a variant section too: `rl.advantage[gigpo].gamma`,
`env[alfworld].memory`, `rl.aux[gcd].clip.clip_low`) is in one of three tables, and a field added
later fails `test_every_setting_of_a_recipe_is_in_one_table` until it is put in one.

- CHANGES: another value changes what the setting's part of a run leaves (with what both runs need
  for the difference to show): a setting read nowhere, or read and then dropped, fails.
- KEEPS: another value leaves it as it was, bit for bit or, where the documentation says so, up to
  float summation order: settings of how something is computed, not what.
- ELSEWHERE: what it changes is not seen by these observables (outputs, faults, the number of
  steps, other processes, the GPU), or not cheaply: the test that checks what it does, which must
  exist and name the setting.

What a setting's part of a run leaves, by where it sits:
- `rl.*`, `sampling.*`, `prompt.*`, `seed`, `model.dtype`: the policy one RL step leaves. The step
  is the two-step task (`twostep.py`) played by a policy that picks either action about half the
  time, so returns differ within each task group, trained in four mini-batches, so that from the
  second on the policy is off its reference and its old log-probs, and the clip ranges, the KL and
  Adam's later steps all act; with GCD, by a policy that also calls actions good or bad about half
  the time each. What is compared is the policy's logits on one prompt and reply.
- `sft.*`: the tiny model after four SFT steps on that task's data (either action in every state).
- `sft.dagger.*`: a DAgger round's labelled examples (the choice model playing the two-step task).
- `env*`: the environment's episodes under a fixed policy: each split's size and first tasks, every
  observation, admissible action, reward and ending, the expert's move in each state, a move no
  parser takes, and the latency wrapper's delays.
- `eval.*`: an evaluation's results and trajectories (the choice model on the two-step task).
- `init.*`: the tiny model created (its config, tokenizer and weights).
"""

import ast
import copy
import hashlib
import json
import re
import time
import types
import typing
from pathlib import Path
from unittest import mock

import pytest
import torch
import twostep

from agentrl.config import Config, Section, SFTConfig
from agentrl.envs.base import NoExpertMove, make_env
from agentrl.models import load_model, load_tokenizer
from agentrl.recipe import validate_config
from agentrl.registry import _Choice
from agentrl.sft import train_sft
from agentrl.trainer import RLTrainer

BASE = {
    "seed": 7, "env": {"type": "twostep"},
    "prompt": {"template": twostep.TEMPLATE, "history_length": 1},
    "sampling": {"max_new_tokens": 24, "temperature": 1.0},
    "rl": {"steps": 1, "tasks_per_step": 2, "group_size": 4, "mini_batch_size": 4, "micro_batch_tokens": 4096,
           "kl_coef": 0.05, "optim": {"lr": 3e-4, "weight_decay": 0.0}},
    "sft": {"epochs": 1, "batch_size": 8, "optim": {"lr": 1e-3, "weight_decay": 0.0}},
    "eval": {"episodes": 2, "splits": ["l0", "l1"], "sampling": {"max_new_tokens": 24}},
}
HOUSEHOLD = {"env.type": "household"}
TESTBED = {"env[testbed].train_size": 5000}
ALFWORLD = {"env[alfworld].data": "<alfworld>"}
SCIENCEWORLD = {"env[scienceworld].splits_dir": "<scienceworld>",
                "env[scienceworld].train_task_types": ["lifespan-longest-lived", "find-animal"]}
SHARDED = ("fsdp2", "zero2", "zero3")


def sharded(phase: str, backend: str) -> dict:
    return {"model.path": "<tiny model>", f"{phase}.actor[{backend}].mixed_precision": True}


GCD = {"rl.aux[gcd].pairs_per_step": 4, "rl.aux[gcd].group_size": 4, "rl.aux[gcd].sampling.max_new_tokens": 16}
"""A GCD judge small enough for the step: 4 pairs judged 4 times each."""
LORA = {"rl.actor.lora.r": 16}
SFT_LORA = {"sft.actor.lora.r": 16}
TINY = {**HOUSEHOLD, "init.vocab_size": 320, "init.hidden_size": 128, "init.layers": 1, "init.intermediate_size": 128,
        "init.context_length": 256, "init.corpus_episodes": 10}
DAGGER = {"sft.dagger.episodes": 4, "sft.dagger.rounds": 3}
LATENCY = {"env[latency].step_median_s": 0.001, "env[latency].reset_median_s": 0.001, "env[latency].reset_sigma": 0.5,
           "env[latency].expert_median_s": 0.001}

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
    "rl.actor.lora.r": (4, LORA),
    "rl.actor.lora.alpha": (8.0, LORA),
    "rl.actor.lora.dropout": (0.5, LORA),
    "rl.actor.lora.target_modules": (["q_proj"], LORA),
    "seed": (8, {}),
    "model.dtype": ("bfloat16", {}),
    "rl.aux[chat_sft].data": ("<good data>", {}),
    "rl.aux[chat_sft].batch_size": (2, {"rl.aux[chat_sft].data": "<choice data>"}),
    "rl.aux[chat_sft].weight": (1.0, {"rl.aux[chat_sft].data": "<choice data>"}),
    "rl.aux[gcd].weight": (0.1, GCD),
    "rl.aux[gcd].judge": ("classifier", GCD),
    "rl.aux[gcd].labels": (["rules"], GCD),
    "rl.aux[gcd].pairs_per_step": (2, GCD),
    "rl.aux[gcd].group_size": (2, GCD),
    "rl.aux[gcd].sampling.temperature": (0.5, GCD),
    "rl.aux[gcd].sampling.top_p": (0.5, GCD),
    "rl.aux[gcd].sampling.max_new_tokens": (6, GCD),
    "rl.aux[gcd].clip.clip_low": (0.005, GCD),
    "rl.aux[gcd].clip.clip_high": (0.005, GCD),
    "rl.aux[gcd].clip.dual_clip": (1.0001, {**GCD, "rl.aux[gcd].clip.clip_high": 10.0}),
    "rl.components[nthr].tau": (1000.0, {"rl.components[nthr].eta": 0.5}),
    "rl.components[nthr].eta": (0.9, {"rl.components[nthr].tau": 1.0}),
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
    "sft.actor.lora.r": (4, SFT_LORA),
    "sft.actor.lora.alpha": (8.0, SFT_LORA),
    "sft.actor.lora.dropout": (0.5, SFT_LORA),
    "sft.actor.lora.target_modules": (["q_proj"], SFT_LORA),
    "sft.dagger.rounds": (2, {**DAGGER, "sft.dagger.expert_share": (1.0, 0.0)}),  # round 2 of 3: a share of 0.5; of 2: 0
    "sft.dagger.episodes": (3, DAGGER),
    "sft.dagger.sampling.temperature": (0.0, DAGGER),
    "sft.dagger.sampling.top_p": (0.5, {**DAGGER, "sft.dagger.sampling.temperature": 1.0}),
    "sft.dagger.sampling.max_new_tokens": (4, DAGGER),
    "sft.dagger.expert_share": ((1.0, 1.0), DAGGER),
    "env.type": ("testbed", HOUSEHOLD),
    **{f"{section}.{name}": (value, context) for section, context in (("env", HOUSEHOLD), ("env[latency].inner", LATENCY))
       for name, value in (("difficulty", "hard"), ("seen_layouts", 5), ("unseen_layouts", 5), ("train_size", 10),
                           ("eval_size", 2), ("max_steps", 3), ("object_variety", 2), ("surface_variety", 6))},
    "env[latency].inner.type": ("testbed", LATENCY),
    "env[latency].step_median_s": (0.002, LATENCY),
    "env[latency].step_sigma": (0.0, LATENCY),
    "env[latency].reset_median_s": (0.002, LATENCY),
    "env[latency].reset_sigma": (0.0, LATENCY),
    "env[latency].expert_median_s": (0.002, LATENCY),
    "env[latency].max_s": (0.0005, LATENCY),
    "env[testbed].horizon": (2, TESTBED),
    "env[testbed].doors": (3, TESTBED),
    "env[testbed].hint_rate": (0.0, TESTBED),
    "env[testbed].distractors": (3, TESTBED),
    "env[testbed].key_choices": (0, TESTBED),
    "env[testbed].delay": (0, TESTBED),
    "env[testbed].slack": (0, TESTBED),
    "env[testbed].expert_key_noise": (1.0, TESTBED),
    "env[testbed].l2_extra_rooms": (0, TESTBED),
    "env[testbed].train_size": (10, TESTBED),
    "env[testbed].eval_size": (2, TESTBED),
    "env[alfworld].max_steps": (3, ALFWORLD),
    "env[alfworld].train_task_types": (["pick_and_place_simple"], ALFWORLD),
    "env[alfworld].expert": ("handcoded", ALFWORLD),
    "env[alfworld].grouped_actions": (True, ALFWORLD),
    "env[alfworld].memory": (True, ALFWORLD),
    "env[scienceworld].train_split": ("l1", SCIENCEWORLD),
    "env[scienceworld].max_steps": (3, SCIENCEWORLD),
    "env[scienceworld].simplification": ("", SCIENCEWORLD),
    "env[scienceworld].objects_budget": (100, SCIENCEWORLD),
    "env[scienceworld].valid_actions": (True, SCIENCEWORLD),
    "env[scienceworld].gold_path": (False, SCIENCEWORLD),
    "env[scienceworld].train_task_types": (["find-animal"], SCIENCEWORLD),
    "env[scienceworld].expert_teleports": (True, SCIENCEWORLD),
    "env[scienceworld].memory": (True, SCIENCEWORLD),
    "env[scienceworld].reject_unparsed": (True, SCIENCEWORLD),
    "eval.splits": (["l0"], {}),
    "eval.episodes": (1, {}),
    "eval.sampling.temperature": (0.0, {}),
    "eval.sampling.top_p": (0.5, {"eval.sampling.temperature": 1.0}),
    "eval.sampling.max_new_tokens": (6, {}),
    "init.vocab_size": (400, TINY),
    "init.hidden_size": (64, TINY),
    "init.layers": (2, TINY),
    "init.intermediate_size": (64, TINY),
    "init.kv_heads": (2, TINY),
    "init.context_length": (512, TINY),
    "init.corpus_episodes": (20, TINY),
    "init.corpus": ("<choice data>", TINY),
    **{f"{phase}.actor[{backend}].{name}": (value, {**sharded(phase, backend), **context})
       for phase in ("rl", "sft") for backend in SHARDED for name, value, context in (
           ("activation_checkpointing", True, {}), ("mixed_precision", False, {}), ("cpu_offload", True, {}),
           ("lora.r", 4, {f"{phase}.actor[{backend}].lora.alpha": 32.0}),
           ("lora.target_modules", ["q_proj"], {f"{phase}.actor[{backend}].lora.r": 16}),
           ("lora.alpha", 8.0, {f"{phase}.actor[{backend}].lora.r": 16}),
           ("lora.dropout", 0.5, {f"{phase}.actor[{backend}].lora.r": 16}))},
}

FLOAT_ORDER = 1e-3  # of the step's own change: what float summation order may move a weight by

KEEPS = {  # setting: (another value, bit for bit?[, settings both runs need])
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
    "env[scienceworld].jvm_heap": ("768m", True, SCIENCEWORLD),
    "env[scienceworld].jvm_options": ("-Xss2m", True, SCIENCEWORLD),
    "eval.batch_size": (1, True, {"eval.sampling.temperature": 0.0}),  # greedy: sampled, it draws in another order
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
    "rl.rollout.filter_groups.max_draws": "test_trainer.py::test_filter_groups_draws_more_tasks_and_trains_only_groups_whose_returns_differ",
    "rl.overlap.staleness": "test_overlap.py::test_staleness_0_plays_the_in_process_runs_samples_and_1_samples_each_step_with_the_weights_it_records",
    "rl.overlap.sampler_threads": "test_overlap.py::test_each_side_runs_on_its_own_threads",
    "rl.overlap.trainer_threads": "test_overlap.py::test_each_side_runs_on_its_own_threads",
    "rl.overlap.sampler_gpu": "test_ray_pool.py::test_a_dead_sampler_actor_stops_the_run_at_the_step_it_owed",
    "rl.overlap.backend": "test_ray_pool.py::test_the_sampler_as_a_ray_actor_trains_what_the_sampler_process_trains_and_leaves_nothing",
    "rl.overlap.ray.address": "test_ray_pool.py::test_a_ray_address_nothing_answers_at_exits_2_at_once_naming_it",
    "rl.overlap.ray.num_cpus": "test_ray_pool.py::test_the_sampler_as_a_ray_actor_trains_what_the_sampler_process_trains_and_leaves_nothing",
    "rl.overlap.ray.num_gpus": "test_ray_pool.py::test_a_dead_sampler_actor_stops_the_run_at_the_step_it_owed",
    "rl.aux[chat_sft].name": "test_trainer.py::test_aux_loss_joins_the_update",
    "rl.aux[gcd].name": "test_trainer.py::test_aux_loss_joins_the_update",
    "rl.aux[gcd].max_critiques": "test_gcd.py::test_critiques_are_of_the_actions_rightly_called_bad",
    "rl.aux[gcd].eval_pairs": "test_gcd.py::test_training_with_gcd_logs_judge_metrics_and_correction",
    "rl.aux[gcd].external.base_url": "test_gcd.py::test_training_with_gcd_logs_judge_metrics_and_correction",
    "rl.aux[gcd].external.model": "test_gcd.py::test_training_with_gcd_logs_judge_metrics_and_correction",
    "rl.aux[gcd].external.api_key_env": "test_gcd.py::test_the_endpoint_retries_each_failure_and_sends_its_key",
    "rl.aux[gcd].external.asks": "test_gcd.py::test_external_judge_over_a_real_http_server",
    "rl.aux[gcd].external.agree": "test_gcd.py::test_external_judge_over_a_real_http_server",
    "rl.aux[gcd].external.pairs_per_step": "test_gcd.py::test_the_external_judges_counts_are_each_steps_own",
    "rl.aux[gcd].external.temperature": "test_gcd.py::test_external_judge_over_a_real_http_server",
    "rl.aux[gcd].external.max_tokens": "test_gcd.py::test_external_judge_over_a_real_http_server",
    "rl.aux[gcd].external.timeout_s": "test_failures.py::test_every_endpoint_failure_is_retried_then_given_up_cleanly",
    "rl.aux[gcd].external.retries": "test_failures.py::test_every_endpoint_failure_is_retried_then_given_up_cleanly",
    "rl.aux[gcd].external.backoff_s": "test_failures.py::test_every_endpoint_failure_is_retried_then_given_up_cleanly",
    "rl.aux[gcd].correction.every": "test_gcd.py::test_correction_hint_is_in_training_prompts_after_a_refresh_and_never_in_evaluation",
    "rl.aux[gcd].correction.summarizer": "test_gcd.py::test_a_summary_the_endpoint_fails_to_give_keeps_the_previous_hint",
    "rl.aux[gcd].correction.critiques": "test_gcd.py::test_correction_summarises_the_newest_critiques",
    "rl.aux[gcd].correction.max_new_tokens": "test_gcd.py::test_correction_hint_is_in_training_prompts_after_a_refresh_and_never_in_evaluation",
    "rl.components[coupling].every": "test_trainer.py::test_coupling_lab_metrics_join_the_step_metrics_on_its_steps",
    "rl.components[coupling].pairs": "test_analysis.py::test_the_coupling_lab_draws_its_pairs_afresh_each_step",
    "rl.components[coupling].lr": "test_analysis.py::test_the_coupling_lab_draws_its_pairs_afresh_each_step",
    **{f"rl.sampler[vllm].{name}": "test_vllm.py::test_the_engine_is_built_with_the_runs_settings"
       for name in ("gpu_memory_utilization", "kv_cache_gib", "max_model_len", "sleep", "enforce_eager")},
    "env[alfworld].data": "test_alfworld.py::test_rl_train_task_types_replace_the_envs_for_rl_only",
    "env[scienceworld].splits_dir": "test_scienceworld.py::test_splits_have_the_documented_sizes",
    "env[scienceworld].failure_penalty": "test_scienceworld.py::test_a_failed_task_costs_the_engine_s_100_points_or_with_the_penalty_off_the_points_held",
    "eval.sampling.retries": "test_rollout_modes.py::test_retries_resample_until_the_action_is_admissible",
    "eval.max_aborted_share": "test_evaluate.py::test_the_aborted_share_is_taken_over_every_episode_played",
    "eval.initial": "test_cli.py::test_what_sft_on_given_data_depends_on",
    "sft.dagger.epochs": "test_dagger.py::test_pipeline_rounds_aggregate_every_label_and_are_reused",
    "run_dir": "test_dagger.py::test_pipeline_rounds_aggregate_every_label_and_are_reused",
    "model.path": "test_failures.py::test_bad_paths_exit_2_at_once_naming_the_path",
    "imports": "test_plugins.py::test_the_guides_plugin_example_end_to_end",
    "tracking": "test_metrics.py::test_a_resumed_tracker_replaces_what_was_logged_after_its_checkpoint",
}


def field_sections(field) -> tuple[object, type | None]:
    """(the registry choice, or None; the section class, or None) a config field holds (also
    inside `| None` and `list[...]`)."""
    choice = next((m for m in field.metadata if isinstance(m, _Choice)), None)
    annotation, section = field.annotation, None
    while True:
        if typing.get_origin(annotation) in (typing.Union, types.UnionType, list):
            annotation = next(a for a in typing.get_args(annotation) if a is not type(None))
        elif typing.get_origin(annotation) is typing.Annotated:
            choice = next((m for m in annotation.__metadata__ if isinstance(m, _Choice)), choice)
            annotation = typing.get_args(annotation)[0]
        else:
            break
    if isinstance(annotation, type) and issubclass(annotation, Section) and annotation is not Section:
        section = annotation
    return choice, section


def settings_of(section: type, prefix: str = "", within: tuple = ()) -> list[str]:
    """The dotted name of every setting of `section` (a class): a variant section's default type
    plainly, each other built-in type in brackets (`rl.advantage[gigpo].gamma`; not the types other
    tests register in the same process), and inside a type only the default of the same registry.
    A field with one possible value (a type's own name) is not a setting."""
    names = []
    for name, field in section.model_fields.items():
        choice, inner = field_sections(field)
        if choice is not None:
            registry = choice.registry
            for kind in [choice.default] if registry in within else registry.names():
                config = registry.entry(kind).config
                if config.__module__.startswith("agentrl."):
                    at = f"{prefix}{name}." if kind == choice.default else f"{prefix}{name}[{kind}]."
                    names += [at + registry.key] * (kind == choice.default) + settings_of(config, at, (*within, registry))
        elif typing.get_origin(field.annotation) is typing.Literal and len(typing.get_args(field.annotation)) == 1:
            continue  # one possible value (a type's own name): nothing to set
        elif inner is not None:
            names += settings_of(inner, f"{prefix}{name}.", within)
        else:
            names.append(f"{prefix}{name}")
    return names


def test_every_setting_of_a_recipe_is_in_one_table():
    tables = [*CHANGES, *KEEPS, *ELSEWHERE]
    assert sorted(tables) == sorted(set(tables)), "a setting in two tables"
    settings = settings_of(Config)
    assert not set(settings) - set(tables), f"in no table: {sorted(set(settings) - set(tables))}"
    assert not set(tables) - set(settings), f"no such setting: {sorted(set(tables) - set(settings))}"


@pytest.mark.parametrize("setting", sorted(ELSEWHERE))
def test_a_setting_checked_elsewhere_names_a_test_that_exists(setting):
    file, name = ELSEWHERE[setting].split("::")
    source = (Path(__file__).parent / file).read_text()
    [test] = [node for node in ast.parse(source).body if isinstance(node, ast.FunctionDef) and node.name == name]
    field = re.sub(r"\[.*?\]", "", setting).split(".")[-1]
    assert field in ast.get_source_segment(source, test), f"{ELSEWHERE[setting]} never names {field}"


LISTS = ("rl.aux", "rl.components")
"""Settings that hold a list of sections: `rl.aux[gcd].weight` is a list of one GCD section."""


def with_settings(run_dir: Path, settings: dict, files: dict):
    """The config of BASE with dotted settings put in (`rl.advantage[gigpo].gamma`: of that type;
    a value named in `files`, e.g. "<choice data>": that path)."""
    recipe = {**copy.deepcopy(BASE), "run_dir": str(run_dir)}
    for dotted, value in settings.items():
        *sections, name = dotted.split(".")
        inner, path = recipe, ""
        for section in sections:
            section, _, kind = section.rstrip("]").partition("[")
            path += section
            if path in LISTS:
                inner = inner.setdefault(section, [{}])[0]
            else:
                inner = inner.setdefault(section, {})
            if kind:
                inner["backend" if section == "actor" else "type"] = kind
            path += "."
        inner[name] = files.get(value, value) if isinstance(value, str) else value
    return validate_config(recipe)
def probe_logits(model, tokenizer) -> torch.Tensor:
    """The model's logits on the task's first prompt and a reply (logits, not weights: LoRA trains
    other parameters than the full model's)."""
    probe = tokenizer(twostep.first_prompt() + twostep.response(twostep.GOOD), return_tensors="pt").input_ids
    with torch.no_grad():
        return model(probe).logits


def step_logits(model_dir, config, run_dir) -> tuple[torch.Tensor, torch.Tensor]:
    """The policy's probe logits before and after one RL step."""
    trainer = RLTrainer(config, str(model_dir), run_dir)
    try:
        before = probe_logits(trainer.model, trainer.tokenizer)
        trainer.train_step()
        return before, probe_logits(trainer.model, trainer.tokenizer)
    finally:
        trainer.close()


def sft_logits(model_dir, config, run_dir) -> tuple[torch.Tensor, torch.Tensor]:
    """The probe logits of the model before and after SFT on the two-step task's data (either
    action in every state)."""
    model, tokenizer = load_model(model_dir), load_tokenizer(model_dir)
    before = probe_logits(model, tokenizer)
    twostep.write_choice_data(run_dir / "data.jsonl")
    out = train_sft(model, tokenizer, run_dir / "data.jsonl", config.sft, config.seed, run_dir / "sft")
    return before, probe_logits(load_model(out), tokenizer)


def dagger_round(model_dir, config, run_dir) -> tuple[str, object]:
    """Round 2's labelled examples and numbers, the model playing."""
    from agentrl.config import EnvPoolConfig
    from agentrl.dagger import dagger_data
    from agentrl.envs.pool import EnvPool
    from agentrl.sampler.hf import HFSampler

    tokenizer = load_tokenizer(model_dir)
    torch.manual_seed(config.seed)
    with EnvPool(config.env, EnvPoolConfig(workers=0)) as pool:
        stats = dagger_data(pool, HFSampler(load_model(model_dir), tokenizer), tokenizer, config, 2, run_dir / "labels.jsonl")
    return (run_dir / "labels.jsonl").read_text(), stats


def evaluation(model_dir, config, run_dir) -> tuple[dict, list]:
    """An evaluation's results and each split's trajectories."""
    from agentrl.pipeline import evaluate_checkpoint

    results = evaluate_checkpoint(config, str(model_dir), run_dir / "eval")
    return results, [(path.name, path.read_text()) for path in sorted((run_dir / "eval").glob("trajectories_*.jsonl"))]


def created_model(config, run_dir) -> tuple[str, str, dict]:
    """The tiny model `init` creates: its config, tokenizer and weights."""
    from agentrl.pipeline import make_tiny_model

    out = make_tiny_model(config, run_dir / "model")
    return (json.loads((out / "config.json").read_text()), (out / "tokenizer.json").read_text(),
            hashlib.sha256((out / "model.safetensors").read_bytes()).hexdigest())


def sharded_actor(config, model_dir, phase: str) -> tuple:
    """What a sharded actor's settings decide before any rank starts: what `agentrl plan` gives each
    part of `phase` on 2 GPUs, and the policy every backend is handed (RL: `load_policy`, SFT:
    `sft_policy`): its trained parameters and its adapters' settings."""
    from agentrl.models import load_policy
    from agentrl.plan import phase_plan
    from agentrl.sft import sft_policy

    plan = phase_plan(config, phase, gpus=2, cuda=True)
    policy = (load_policy(config, str(model_dir)) if phase == "rl"
              else sft_policy(load_model(model_dir), config.sft.actor, config.seed))
    adapters = {name: (c.r, c.lora_alpha, c.lora_dropout, sorted(c.target_modules))
                for name, c in getattr(policy, "peft_config", {}).items()}
    return plan, {name: tuple(p.shape) for name, p in policy.named_parameters() if p.requires_grad}, adapters


def seen(observation) -> tuple:
    return (observation.text, observation.task, observation.admissible_actions, observation.anchor,
            observation.actions_text, observation.memory)


def expert_move(env):
    if not hasattr(env, "expert_action"):
        return None
    try:
        return env.expert_action()
    except NoExpertMove:
        return "no expert move"


def episode(env, task: str, moves: int = 6) -> list:
    """A task played by a fixed policy (an admissible action picked by the move's number), what
    the expert would do in each state, and once a move no parser takes."""
    observation, record = env.reset(task), []
    for move in range(moves):
        record += [seen(observation), expert_move(env)]
        if move == 1 and hasattr(env, "try_step"):
            record.append(repr(env.try_step("xyzzy the moon")))
        actions = observation.admissible_actions or ["look around"]
        result = env.step(actions[(3 * move + 1) % len(actions)])
        record.append((result.reward, result.done, result.success, result.progress))
        observation = result.observation
        if result.done:
            break
    return record + [seen(observation)]


def env_trace(section) -> list:
    """An environment's split sizes and first tasks' types, two train tasks and each split's first
    task played (`episode`), and the delays the latency wrapper slept (drawn from one seed)."""
    import random
    from types import SimpleNamespace

    slept = []
    with mock.patch("agentrl.envs.latency.time", SimpleNamespace(sleep=lambda s: slept.append(s) or time.sleep(s))):
        env = make_env(section)
        if section.type == "latency":
            env._rng = random.Random(0)
        trace = []
        try:
            for split in ("train", "l0", "l1", "l2"):
                tasks = env.split_tasks(split)
                trace.append((split, len(tasks)))
                for task in tasks[:2 if split == "train" else 1]:
                    trace += [task, env.task_type(task), *episode(env, task)]
        finally:
            env.close()
    return trace + slept


PARTS = (("rl.actor[", "actor"), ("sft.actor[", "actor"), ("env", "env"), ("eval.", "eval"), ("init.", "init"), ("sft.dagger.", "dagger"), ("sft.", "sft"),
         ("rl.aux[gcd].", "gcd"))
"""Which part of a run a setting is tried on, by its name's beginning (else an RL step)."""


def part_of(setting: str) -> str:
    return next((part for prefix, part in PARTS if setting.startswith(prefix)), "rl")


class Files(dict):
    """The paths a table's values name, made or found when first asked for."""

    def __init__(self, request, tmp_path_factory):
        super().__init__()
        self.request, self.tmp = request, tmp_path_factory

    def get(self, key, default=None):
        if key not in self and key.startswith("<"):
            if key in ("<choice data>", "<good data>"):
                self[key] = self.tmp.mktemp("data") / "data.jsonl"
                twostep.write_choice_data(self[key], (twostep.GOOD, twostep.BAD) if key == "<choice data>" else (twostep.GOOD,))
            elif key == "<tiny model>":
                self[key] = self.request.getfixturevalue("tiny_model_dir")
            elif key == "<alfworld>":
                self[key] = self.request.getfixturevalue("alfworld_data")
            elif key == "<scienceworld>":
                self[key] = self.request.getfixturevalue("scienceworld_splits")
        return str(self[key]) if key in self else default


@pytest.fixture(scope="module")
def judge_model_dir(tiny_model_dir, tmp_path_factory):
    """The two-step task's choice model that also judges either action good or bad, each about
    half the time (GCD's judgments then differ within each group)."""
    out = tmp_path_factory.mktemp("judge")
    twostep.write_choice_data(out / "data.jsonl", judgments=True)
    train_sft(load_model(tiny_model_dir), load_tokenizer(tiny_model_dir), out / "data.jsonl",
              SFTConfig(epochs=20, batch_size=8, optim={"lr": 3e-3}), 0, out / "model")
    return out / "model"


@pytest.fixture(scope="module")
def outcome(request, tmp_path_factory):
    """What a part of a run leaves with `settings`: (before, after) probe logits for training
    parts, else a record compared exactly; with BASE and no settings but the context kept."""
    files, cache = Files(request, tmp_path_factory), {}

    def run(part: str, settings: dict):
        key = repr((part, sorted(settings.items())))
        if key in cache:
            return cache[key]
        run_dir = tmp_path_factory.mktemp(part)
        config = with_settings(run_dir, settings, files)
        model = lambda name: request.getfixturevalue(name)  # noqa: E731
        result = {"rl": lambda: step_logits(model("choice_model_dir"), config, run_dir),
                  "gcd": lambda: step_logits(model("judge_model_dir"), config, run_dir),
                  "sft": lambda: sft_logits(model("tiny_model_dir"), config, run_dir),
                  "dagger": lambda: dagger_round(model("choice_model_dir"), config, run_dir),
                  "eval": lambda: evaluation(model("choice_model_dir"), config, run_dir),
                  "init": lambda: created_model(config, run_dir),
                  "env": lambda: env_trace(config.env),
                  "actor": lambda: sharded_actor(config, model("tiny_model_dir"),
                                                 "rl" if any(name.startswith("rl.") for name in settings) else "sft")}[part]()
        cache[key] = result
        return result
    return run


def largest(difference: torch.Tensor) -> float:
    return difference.abs().max().item()


TRAINING = ("rl", "gcd", "sft")


@pytest.mark.parametrize("setting", sorted(CHANGES))
def test_another_value_of_a_setting_changes_what_its_part_of_a_run_leaves(setting, outcome):
    other, context = CHANGES[setting]
    part = part_of(setting)
    base, changed = outcome(part, context), outcome(part, {**context, setting: other})
    if part in TRAINING:
        (before, after), (_, changed) = base, changed
        assert largest(changed - after) > FLOAT_ORDER * largest(after - before), (largest(changed - after), largest(after - before))
    else:
        assert changed != base


@pytest.mark.parametrize("setting", sorted(KEEPS))
def test_another_value_of_a_setting_of_how_something_is_computed_keeps_it(setting, outcome):
    other, exact, *context = KEEPS[setting]
    context = context[0] if context else {}
    part = part_of(setting)
    base, kept = outcome(part, context), outcome(part, {**context, setting: other})
    if part in TRAINING:
        (before, after), (_, kept) = base, kept
        assert largest(kept - after) <= (0 if exact else FLOAT_ORDER * largest(after - before)), (largest(kept - after), largest(after - before))
    else:
        assert kept == base
