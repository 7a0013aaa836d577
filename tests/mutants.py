"""Mutation pass: small semantic breakages of the code, one at a time, each run against the tests
that should notice it. A mutant is killed when a test fails; one that survives is a breakage
that would corrupt a research result without the suite saying so.

    .venv/bin/python tests/mutants.py                 # all, against this checkout (~30 min)
    .venv/bin/python tests/mutants.py --only gigpo    # names containing "gigpo"
    .venv/bin/python tests/mutants.py --root DIR      # another checkout (its src/ and tests/)

Each mutant replaces the first occurrence of one snippet in one file and restores the file
afterwards (also on Ctrl-C). Not part of `make test`: `make mutants` runs it.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

TRAINER = ["test_trainer.py", "test_direction.py", "test_lora.py", "test_gcd.py"]
ESTIMATORS = ["test_advantages.py", "test_grpo.py", "test_direction.py"]
LOSSES = ["test_actor.py", "test_kernels.py", "test_direction.py"]
ROLLOUT = ["test_trainer.py", "test_pool.py", "test_household.py", "test_direction.py"]
GCD = ["test_gcd.py"]
EVAL = ["test_evaluate.py", "test_cli.py"]
FAILURES = ["test_failures.py"]
COMPARE = ["test_compare.py"]
TESTBED = ["test_testbed.py"]
PACKING = ["test_packing.py"]
VLLM_PY = Path(__file__).resolve().parents[1] / ".venv-vllm" / "bin" / "python"  # test_vllm.py runs there


@dataclass
class Mutant:
    name: str
    path: str
    old: str
    new: str
    tests: list[str]


MUTANTS = [
    # --- the trainer -------------------------------------------------------------------------------
    Mutant("trainer: every step gets the negated advantage", "src/agentrl/components.py",
           'sample.advantages = [a] * sample.n_targets',
           'sample.advantages = [-a] * sample.n_targets', TRAINER),
    Mutant("trainer: loss aggregated by the rank's own token count", "src/agentrl/trainer.py",
           "distributed.all_sum([sum(lengths), len(lengths)])", "[sum(lengths), len(lengths)]",
           TRAINER + ["test_distributed.py"]),
    Mutant("trainer: aborted episodes and their groups kept", "src/agentrl/trainer.py",
           "broken = {t.group_id for t in trajectories if t.aborted}", "broken = set()", TRAINER),
    Mutant("trainer: only the aborted episode dropped, not its group", "src/agentrl/trainer.py",
           "usable = [t for t in trajectories if t.group_id not in broken]",
           "usable = [t for t in trajectories if not t.aborted]", TRAINER),
    Mutant("trainer: policy loss ignores the sampling temperature", "src/agentrl/trainer.py",
           "StepLoss(self.rl, config.sampling.temperature or 1.0)", "StepLoss(self.rl, 1.0)", TRAINER),
    Mutant("trainer: sampler check scores at temperature 1", "src/agentrl/trainer.py",
           "rl, temperature = self.rl, self.config.sampling.temperature or 1.0\n        found",
           "rl, temperature = self.rl, 1.0\n        found", ["test_trainer.py"]),
    Mutant("trainer: one response token changed between sampling and training", "src/agentrl/trainer.py",
           "TrainSample.from_turn(s.prompt_ids, s.response_ids,",
           "TrainSample.from_turn(s.prompt_ids, s.response_ids[:-1] + [s.response_ids[-1] ^ 1],", ["test_trainer.py"]),
    Mutant("rollout: responses re-tokenised from their text", "src/agentrl/rollout/collect.py",
           "prompt_ids=e.prompt_ids, response_ids=gen.token_ids,",
           "prompt_ids=e.prompt_ids, response_ids=self.tokenizer(response, add_special_tokens=False).input_ids,",
           ["test_trainer.py"]),
    Mutant("trainer: sampler-actor gap measured in every mini-batch (after the weights moved)",
           "src/agentrl/trainer.py", "first = check and epoch == 0 and k == 0", "first = check", ["test_trainer.py"]),
    Mutant("trainer: sampler-actor KL with its ratio inverted", "src/agentrl/losses/step.py",
           '"check/k3": k3(log_ratio).sum()', '"check/k3": k3(-log_ratio).sum()', ["test_metrics.py", "test_trainer.py"]),
    Mutant("sampler check: the gap's mean over one token", "src/agentrl/losses/step.py",
           'n = max(tally.counts.pop("check/n"), 1)', 'n = 1 + 0 * tally.counts.pop("check/n")',
           ["test_metrics.py", "test_trainer.py"]),
    Mutant("metrics: the largest value summed over micro-batches", "src/agentrl/metrics.py",
           'max(mine.get(key, value), value) if kind == "largest"', 'mine.get(key, 0.0) + value if kind == "largest"',
           ["test_metrics.py", "test_trainer.py"]),
    Mutant("metrics: per-update values reported as their sum", "src/agentrl/metrics.py",
           "{k: v / max(n_updates, 1) for k, v in self.per_update.items()}", "self.per_update",
           ["test_metrics.py", "test_trainer.py"]),
    Mutant("metrics: the largest value over ranks is this rank's", "src/agentrl/metrics.py",
           "total.largest[key] = distributed.all_max(self.largest.get(key, float(\"-inf\")))",
           "total.largest[key] = self.largest.get(key, float(\"-inf\"))", ["test_metrics.py"]),
    Mutant("metrics: a metric one rank lacks counted there as 1", "src/agentrl/metrics.py",
           "getattr(self, kind).get(key, 0.0) for kind, key in sums", "getattr(self, kind).get(key, 1.0) for kind, key in sums",
           ["test_metrics.py"]),
    Mutant("trainer: KL-in-reward penalty with its sign flipped", "src/agentrl/losses/reference.py",
           "step.penalty += penalty", "step.penalty -= penalty", TRAINER),
    Mutant("trainer: entropy bonus with its sign flipped", "src/agentrl/losses/step.py",
           "loss = -coef * (batch.weight * entropy).sum()", "loss = coef * (batch.weight * entropy).sum()",
           TRAINER + ["test_distributed.py"]),
    Mutant("trainer: KL loss term with its sign flipped", "src/agentrl/losses/step.py",
           "LossOutputs(coef * (batch.weight * kl).sum()", "LossOutputs(-coef * (batch.weight * kl).sum()", TRAINER),
    Mutant("trainer: reference log-probs at temperature 1", "src/agentrl/losses/reference.py",
           "return response_logprobs(self.reference, tokens, self.temperature)[0]",
           "return response_logprobs(self.reference, tokens, 1.0)[0]", TRAINER),
    Mutant("batch: per-sample values split back in the wrong order", "src/agentrl/actor/batch.py",
           "for s, part in zip(chunk, values.split([s.n_targets for s in chunk])):",
           "for s, part in zip(chunk[::-1], values.split([s.n_targets for s in chunk[::-1]])):",
           TRAINER + ["test_nthr.py"]),
    Mutant("trainer: mini-batch order not reseeded per step", "src/agentrl/trainer.py",
           'order = random.Random(step_seed(self.config.seed, step, "shuffle"))', "order = random.Random()", TRAINER),
    Mutant("trainer: critic regresses onto the advantages, not the returns", "src/agentrl/critic.py",
           "returns = [r for values in batch.advantages.returns for r in values]",
           "returns = [r for values in batch.advantages.values for r in values]", TRAINER),
    # --- rollout -----------------------------------------------------------------------------------
    Mutant("rollout: GiGPO anchor taken from the rendered prompt", "src/agentrl/rollout/collect.py",
           "anchor=e.observation.anchor", "anchor=e.prompt_text", ROLLOUT),
    Mutant("rollout: correction hint never put into the prompts", "src/agentrl/rollout/collect.py",
           'e.prompt_text = f"{self.hint}\\n{text}" if self.hint else text', "e.prompt_text = text", ROLLOUT + GCD),
    Mutant("rollout: finished episodes keep playing", "src/agentrl/rollout/collect.py",
           "e.trajectory.success = result.success\n            return False",
           "e.trajectory.success = result.success", ROLLOUT),
    Mutant("rollout: invalid steps not penalised", "src/agentrl/rollout/collect.py",
           "penalty=0.0 if action is not None else self.prompt.invalid_penalty", "penalty=0.0", ROLLOUT),
    Mutant("async rollout: a batch's generations handed to the wrong episodes", "src/agentrl/rollout/collect.py",
           "outputs = list(zip(ready, rules.retry(", "outputs = list(zip(ready[::-1], rules.retry(",
           ["test_rollout_modes.py"]),
    Mutant("pool: a failed worker's later messages not aborted", "src/agentrl/envs/pool.py",
           "for _, slots in self._queue[worker]:", "for _, slots in list(self._queue[worker])[:1]:",
           ["test_pool.py", "test_ray_pool.py", "test_rollout_modes.py"]),
    Mutant("pool: a dead worker's episodes not aborted", "src/agentrl/envs/pool.py",
           "self._arrived.update({slot: None for slot in slots})", "pass",
           ["test_pool.py", "test_ray_pool.py", "test_rollout_modes.py"]),
    Mutant("scienceworld: first step's reward without the points of the reset's look", "src/agentrl/envs/scienceworld/env.py",
           "self.task_id, self.steps, self.score = task_id, 0, 0",
           "self.task_id, self.steps, self.score = task_id, 0, int(round(100 * self._server.getScore()))",
           ["test_scienceworld.py"]),
    # --- estimators --------------------------------------------------------------------------------
    Mutant("gigpo: episode normalisation over all task groups", "src/agentrl/advantages/gigpo.py",
           "episode_rewards = [t.episode_reward for t in group]",
           "episode_rewards = [t.episode_reward for t in trajectories]", ESTIMATORS),
    Mutant("gigpo: anchor groups span all task groups", "src/agentrl/advantages/gigpo.py",
           "anchors = anchor_groups(group, returns)",
           "anchors = anchor_groups(trajectories, {id(u): [r - s.penalty for r, s in zip(discounted_returns("
           "[s.reward for s in u.steps], config.gamma), u.steps)] for u in trajectories})", ESTIMATORS),
    Mutant("gigpo: step returns undiscounted", "src/agentrl/advantages/gigpo.py",
           "[s.reward for s in t.steps],\n                                                                             config.gamma)",
           "[s.reward for s in t.steps], 1.0)", ESTIMATORS),
    Mutant("gae: no TD(lambda) recursion (GAGPO, PPO)", "src/agentrl/advantages/common.py",
           "v[t + 1] - v[t] + gamma * lam * running", "v[t + 1] - v[t]", ESTIMATORS),
    Mutant("gagpo: state values shifted by one step", "src/agentrl/advantages/gagpo.py",
           "[value_of[s.anchor] for s in t.steps], config.gamma, config.lam)",
           "[value_of[s.anchor] for s in t.steps][1:] + [0.0], config.gamma, config.lam)", ESTIMATORS),
    Mutant("gagpo: invalid penalty ignored", "src/agentrl/advantages/gagpo.py",
           "raw[id(t)] = [a - s.penalty for a, s in zip(out, t.steps)]", "raw[id(t)] = out", ESTIMATORS),
    Mutant("grpo: invalid penalty ignored", "src/agentrl/advantages/grpo.py",
           "scores = {id(t): [t.episode_reward - s.penalty for s in t.steps] for t in group}",
           "scores = {id(t): [t.episode_reward for s in t.steps] for t in group}", ESTIMATORS),
    Mutant("estimators: population std instead of the sample std", "src/agentrl/advantages/common.py",
           '"sample": statistics.stdev', '"sample": statistics.pstdev', ESTIMATORS),
    Mutant("estimators: group normalisation not centred", "src/agentrl/advantages/common.py",
           "return [(x - mean) / scale for x in values]", "return [x / scale for x in values]", ESTIMATORS),
    Mutant("rloo: baseline includes the episode itself", "src/agentrl/advantages/rloo.py",
           "t.episode_reward - (total - t.episode_reward) / (k - 1)", "t.episode_reward - total / k", ESTIMATORS),
    Mutant("ppo: GAE lambda ignored", "src/agentrl/advantages/ppo.py",
           "values, config.gamma, config.lam)", "values, config.gamma, 1.0)", ESTIMATORS),
    Mutant("rlvmr: explore rewarded for revisiting a state", "src/agentrl/advantages/rlvmr.py",
           "new = traj.steps[t + 1].anchor not in seen", "new = traj.steps[t + 1].anchor in seen", ESTIMATORS),
    # --- losses ------------------------------------------------------------------------------------
    Mutant("ppo_clip: dual clip also caps positive advantages", "src/agentrl/losses/policy.py",
           "dual = (advantages < 0) & (loss > cap)", "dual = loss > cap", LOSSES),
    Mutant("seq_ratio: summed instead of mean token log-ratio", "src/agentrl/losses/policy.py",
           "ratio = torch.exp(sums / counts)[segments]", "ratio = torch.exp(sums)[segments]", LOSSES),
    Mutant("aggregation: seq-mean-token-mean without the sequence count", "src/agentrl/losses/policy.py",
           "return [1.0 / (max(n, 1) * n_seqs) for n in lengths]", "return [1.0 / max(n, 1) for n in lengths]",
           LOSSES),
    Mutant("k3 KL estimator without the -1", "src/agentrl/losses/policy.py",
           "torch.exp(log_ratio) - log_ratio - 1", "torch.exp(log_ratio) - log_ratio", LOSSES),
    # --- sampler -----------------------------------------------------------------------------------
    Mutant("hf sampler: log-probs without the temperature", "src/agentrl/sampler/hf.py",
           "torch.log_softmax(step.float() / temperature, -1)", "torch.log_softmax(step.float(), -1)",
           ["test_actor.py", "test_direction.py"]),
    Mutant("hf sampler: end-of-turn token dropped from the response", "src/agentrl/sampler/hf.py",
           "length = ids.index(self.eos_id) + 1 if", "length = ids.index(self.eos_id) if",
           ["test_actor.py", "test_direction.py", "test_trainer.py"]),
    # --- GCD ---------------------------------------------------------------------------------------
    Mutant("gcd: an unparseable verdict rewarded as correct", "src/agentrl/losses/gcd.py",
           "return float(verdict is not None and verdict == label)", "return float(verdict in (label, None))", GCD),
    Mutant("gcd: judgment advantages without the group baseline", "src/agentrl/losses/gcd.py",
           'return normalize(rewards, rewards, "population", 1e-6)',
           "return [r / (statistics.pstdev(rewards) + 1e-6) for r in rewards]", GCD),
    Mutant("gcd: judgment advantages with the sample std", "src/agentrl/losses/gcd.py",
           'return normalize(rewards, rewards, "population", 1e-6)', 'return normalize(rewards, rewards, "sample", 1e-6)',
           GCD),
    Mutant("gcd: a failed episode's last step labelled good", "src/agentrl/gcd/labels.py",
           "if traj.success and traj.steps:", "if traj.steps:", GCD),
    Mutant("gcd: the external judge's verdict inverted", "src/agentrl/gcd/labels.py",
           "labelled[(t, i)] = LabeledStep(trajectories[t].steps[i], verdict, \"llm\",",
           "labelled[(t, i)] = LabeledStep(trajectories[t].steps[i], not verdict, \"llm\",", GCD),
    Mutant("gcd: correction refresh skipped", "src/agentrl/gcd/correction.py",
           "if (step - 1) % self.config.every or step == 1:", "if True:", GCD),
    # --- evaluation statistics and checkpoints -----------------------------------------------------
    Mutant("eval: aborted episodes counted as failures", "src/agentrl/evaluate.py",
           "trajectories = [t for t in trajectories if not t.aborted]", "trajectories = list(trajectories)", EVAL),
    Mutant("eval: Wilson interval without the centre correction", "src/agentrl/evaluate.py",
           "centre = (p + z * z / (2 * n)) / (1 + z * z / n)", "centre = p", EVAL),
    Mutant("checkpoint: optimizer state not restored", "src/agentrl/actor/single.py",
           'self.optimizer.load_state_dict(saved["optimizer"])', "pass", TRAINER),
    Mutant("checkpoint: resumed run restarts its step count", "src/agentrl/trainer.py",
           'self.step = state["step"]', "self.step = 0", TRAINER),
    # --- sampler-trainer gap ------------------------------------------------------------------------
    Mutant("trainer: rl.old_logprobs: actor ignored", "src/agentrl/trainer.py",
           "sample.old_logprobs = actor_logp.tolist()", "pass", ["test_trainer.py"]),
    Mutant("trainer: TIS weights not applied", "src/agentrl/losses/step.py",
           "pg = batch.is_weight * pg", "pg = pg", ["test_trainer.py"]),
    # --- failures ------------------------------------------------------------------------------------
    Mutant("trainer: a step of aborted episodes goes on", "src/agentrl/trainer.py",
           "if total and aborted / total > rl.max_aborted_share:", "if False:", FAILURES),
    Mutant("actor: a non-finite update applied", "src/agentrl/actor/single.py",
           "        if finite:\n", "        if True:\n", FAILURES),
    Mutant("actor: bf16 weights updated in bf16 (no fp32 master copies)", "src/agentrl/actor/single.py",
           "self.master = [p if p.dtype == torch.float32 else p.detach().float().requires_grad_() for p in self.parameters]",
           "self.master = list(self.parameters)", ["test_actor.py"]),
    # --- sharded SFT -------------------------------------------------------------------------------
    Mutant("sft: every rank trains the whole batch", "src/agentrl/sft.py",
           "micro_batches(chunk[rank::world],", "micro_batches(chunk,", ["test_distributed.py"]),
    Mutant("sft: loss divided by the rank's own weight", "src/agentrl/sft.py",
           "total_weight = sum(sum(s.weight) for s in chunk)",
           "total_weight = sum(sum(s.weight) for s in chunk[rank::world])", ["test_distributed.py"]),
    Mutant("sft: a resumed run retrains the steps before its checkpoint", "src/agentrl/sft.py",
           "if step <= start:\n                    continue", "if False:\n                    continue",
           ["test_distributed.py"]),
    Mutant("parser: nested action tags keep the outer opening", "src/agentrl/prompting.py",
           'start = lower.rfind("<action>", first, end)', "start = first", ["test_prompting.py"]),
    # --- comparisons and the testbed ----------------------------------------------------------------
    Mutant("compare: runs paired by position, not by seed", "src/agentrl/compare.py",
           "pairs = [(r, by_seed[r.seed]) for r in a if r.seed in by_seed]", "pairs = list(zip(a, b))", COMPARE),
    Mutant("compare: interval over pooled episodes instead of seeds", "src/agentrl/compare.py",
           '"difference": mean, "ci95": stats.interval(diffs)',
           '"difference": mean, "ci95": stats.interval([d for s in scores for d in s])', COMPARE),
    Mutant("compare: a task one method did not play counted as a failure", "src/agentrl/compare.py",
           "tasks = sorted(set(x.outcomes[split]) & set(y.outcomes[split]))",
           "tasks = sorted(set(x.outcomes[split]) | set(y.outcomes[split]))", COMPARE),
    Mutant("stats: evaluation variance not divided by the episodes", "src/agentrl/stats.py",
           "np.var(s, ddof=1) / len(s)", "np.var(s, ddof=1)", COMPARE),
    Mutant("stats: detectable difference without the power term", "src/agentrl/stats.py",
           "+ stats.t.ppf(power, seeds - 1)", "", COMPARE),
    Mutant("stats: more episodes shrink the training spread too", "src/agentrl/stats.py",
           "variance = parts.between_sd ** 2 + parts.within_sd ** 2 * parts.episodes / episodes",
           "variance = (parts.between_sd ** 2 + parts.within_sd ** 2) * parts.episodes / episodes", COMPARE),
    Mutant("stats: ties count as wins", "src/agentrl/stats.py",
           "+ 0.5 * (a[..., :, None] == b[..., None, :])", "+ 1.0 * (a[..., :, None] == b[..., None, :])", COMPARE),
    Mutant("testbed: a wrong key opens the chest", "src/agentrl/envs/testbed/env.py",
           "opened = self.key == self.corridor.goal or", "opened = self.key is not None or", TESTBED),
    Mutant("testbed: go back from a dead end skips a room", "src/agentrl/envs/testbed/env.py",
           "            if self.dead_end:\n                self.dead_end = False\n            else:",
           "            if self.dead_end:\n                self.dead_end = False\n                self.room -= 1\n            else:",
           TESTBED),
    Mutant("testbed: L1 asks for seen chest colours", "src/agentrl/envs/testbed/env.py",
           'goal = rng.choice(HELD_OUT_GOALS if split in ("l1", "l2") else SEEN_GOALS)',
           'goal = rng.choice(HELD_OUT_GOALS if split == "l2" else SEEN_GOALS)', TESTBED),
    Mutant("testbed: examine is counted as progress", "src/agentrl/envs/testbed/env.py",
           'useless = not admissible or action.startswith("examine")', "useless = not admissible", TESTBED),
    Mutant("sft data: a detour's example teaches the random action", "src/agentrl/data.py",
           "        if detours and rng.random() < detours:\n            action = rng.choice(obs.admissible_actions)\n"
           "            detoured = True\n",
           "        if detours and rng.random() < detours:\n            action = rng.choice(obs.admissible_actions)\n"
           "            detoured = True\n            examples[-1][\"messages\"][1][\"content\"] = format_response(thought, action, tag)\n",
           ["test_sft.py"]),
    Mutant("sft data: detours are ignored", "src/agentrl/data.py",
           "if detours and rng.random() < detours:", "if False:", ["test_sft.py"]),
    Mutant("sft data: a failed episode dropped despite keep_failed", "src/agentrl/data.py",
           "return examples if result.success or detoured or keep_failed else []",
           "return examples if result.success or detoured else []", TESTBED),
    Mutant("sft data: worker processes play the tasks in reverse order", "src/agentrl/data.py",
           "yield from pool.map(_worker_episode, tasks)", "yield from pool.map(_worker_episode, tasks[::-1])",
           ["test_sft.py"]),
    Mutant("alfworld: the memoised engine shares one variables dict between derivations",
           "src/agentrl/envs/alfworld/speedups.py", '"variables": dict(context["variables"])',
           '"variables": context["variables"]', ["test_alfworld.py"]),
    Mutant("alfworld: the memoised engine keeps translating the first game it loaded",
           "src/agentrl/envs/alfworld/speedups.py", "return translate(domain, problem, optimize)",
           'return translate(domain, _ORIGINALS.setdefault("first", problem), optimize)', ["test_alfworld.py"]),
    Mutant("alfworld observer: searches in listing order, not where the train games put the object",
           "src/agentrl/envs/alfworld/observer.py",
           "candidates.sort(key=lambda r: (rank.get(kind_of(r), len(rank)), kind_of(r), number_of(r)))",
           "candidates.sort(key=lambda r: (kind_of(r), number_of(r)))", ["test_alfworld.py"]),
    Mutant("alfworld notebook: receptacles that share the agent's spot are not counted as searched",
           "src/agentrl/envs/alfworld/observer.py",
           'if recep != self.location and f"go to {recep}" not in admissible:', "if False:", ["test_alfworld.py"]),
    Mutant("alfworld notebook: what was done to the held object goes unsaid", "src/agentrl/envs/alfworld/observer.py",
           'held = self.holding + "".join(', 'held = self.holding or "".join(', ["test_alfworld.py"]),
    Mutant("alfworld: grouped actions drop the ungrouped ones", "src/agentrl/envs/alfworld/env.py",
           "for verb, targets in groups.items()] + rest)", "for verb, targets in groups.items()])",
           ["test_alfworld.py"]),
    Mutant("prompt: the environment's memory is never shown", "src/agentrl/prompting.py",
           'memory=obs.memory or "(none)"', 'memory="(none)"', ["test_prompting.py"]),
    Mutant("rollout: retries keep the first sample", "src/agentrl/rollout/collect.py",
           "for _ in range(sampling.retries):", "for _ in range(0):", ["test_rollout_modes.py"]),
    Mutant("rollout: retries resample every episode, admissible or not", "src/agentrl/rollout/collect.py",
           "if not self.playable(e, gen)]", "]", ["test_rollout_modes.py"]),
    Mutant("config: setting one field of the evaluation's sampling resets its temperature to 1",
           "src/agentrl/config/sections.py", "temperature: float = Field(0.4, ge=0)",
           "temperature: float = Field(1.0, ge=0)", ["test_config.py"]),
    Mutant("dagger: the rounds' labels reused when the environment or prompt changed", "src/agentrl/pipeline.py",
           "    if config.sft.dagger is not None:  # the rounds play", "    if False:  # the rounds play",
           ["test_dagger.py"]),
    Mutant("dagger: the rounds play with the evaluation's sampling", "src/agentrl/dagger.py",
           "config.prompt, dagger.sampling,", "config.prompt, config.eval.sampling,", ["test_dagger.py"]),
    Mutant("dagger: the expert's move executed with the policy's share", "src/agentrl/dagger.py",
           "if rng.random() < share:", "if rng.random() >= share:", ["test_dagger.py"]),
    Mutant("dagger: a state is labelled with the policy's own move", "src/agentrl/dagger.py",
           "format_response(thought, expert_action)", "format_response(thought, action)", ["test_dagger.py"]),
    Mutant("dagger: the history shows the policy's move where the expert's was executed", "src/agentrl/dagger.py",
           "action = e.trajectory.steps[-1].action = expert_action", "action = expert_action", ["test_dagger.py"]),
    Mutant("dagger: a round trains on its own labels only, not the aggregate", "src/agentrl/pipeline.py",
           'write_atomic(aggregate, "".join(source.read_text() for source in sources))',
           "write_atomic(aggregate, sources[-1].read_text())", ["test_dagger.py"]),
    Mutant("pool: a worker's expert labels every slot from its first slot's episode", "src/agentrl/envs/pool.py",
           "else expert_move(env))", "else expert_move(self.envs[min(self.envs)]))", ["test_dagger.py"]),
    Mutant("scienceworld: action templates read before a task is loaded (the engine's error message)",
           "src/agentrl/envs/scienceworld/env.py", "if not self.templates:  # before",
           "if False:  # before", ["test_scienceworld.py"]),
    Mutant("sft data: a dead expert-data worker is a bare BrokenProcessPool, not the main-guard hint",
           "src/agentrl/data.py", "except BrokenProcessPool:", "except KeyError:", ["test_sft.py"]),
    Mutant("testbed: the random demonstrator takes the fitting key", "src/agentrl/envs/testbed/env.py",
           'random.Random(f"testbed-expert:{task_id}").choice(keys) if noisy', "self.corridor.goal if noisy", TESTBED),
    Mutant("testbed report: a pair written baseline - method is not turned round", "benchmarks/testbed_table.py",
           '"difference": -row["difference"]', '"difference": row["difference"]', ["test_readme_tables.py"]),
    Mutant("results: rows written over the file in place", "benchmarks/results_csv.py",
           'partial = path.with_name(path.name + ".partial")', "partial = path", ["test_readme_tables.py"]),
    Mutant("readme tables: a CSV table keeps every row", "benchmarks/readme_tables.py",
           "if all(row[k] == v for k, v in where)", "if True", ["test_readme_tables.py"]),
    Mutant("judge counts: every answer counts as parsed", "src/agentrl/gcd/judge.py",
           '"parsed": sum(v is not None for a in received for v in a)', '"parsed": sum(map(len, received))', GCD),
    Mutant("judge counts: agreed counts the steps asked", "src/agentrl/gcd/judge.py",
           '"agreed": sum(v is not None for v in verdicts)', '"agreed": len(steps)', GCD),
    Mutant("serve: a streaming request is answered as if not streamed", "src/agentrl/serve.py",
           'if body.get("stream"):', "if False:", GCD),
    Mutant("tis: weights p_sampler / p_actor", "src/agentrl/trainer.py",
           "torch.clamp(torch.exp(log_ratio), max=rl.tis_cap)", "torch.clamp(torch.exp(-log_ratio), max=rl.tis_cap)",
           ["test_trainer.py"]),
    Mutant("tis: the cap binds from below", "src/agentrl/trainer.py",
           "torch.clamp(torch.exp(log_ratio), max=rl.tis_cap)", "torch.clamp(torch.exp(log_ratio), min=rl.tis_cap)",
           ["test_trainer.py"]),
    # --- sharded actors ------------------------------------------------------------------------------
    Mutant("hf sampler: a pushed weight never copied into the sampler's full copy", "src/agentrl/sampler/hf.py",
           "params[name].copy_(tensor)", "pass", ["test_distributed.py"]),
    Mutant("deepspeed: a skipped non-finite step not counted", "src/agentrl/actor/deepspeed.py",
           "skipped = not self.engine.was_step_applied()", "skipped = False", ["test_distributed.py"]),
    Mutant("tracking: a resumed phase starts a new W&B run", "src/agentrl/tracking.py",
           "if resume_step == 0 or not id_file.exists():", "if True:", ["test_cli.py"]),
    Mutant("vllm: the prefix cache kept across a weight push", "src/agentrl/sampler/vllm.py",
           "        self.llm.reset_prefix_cache()\n", "", ["test_vllm.py"]),
    Mutant("fsdp2: every rank loads the whole model before sharding", "src/agentrl/actor/__init__.py",
           'return config.backend == "fsdp2" and', 'return False and', ["test_distributed.py"]),
    Mutant("fsdp2: every rank reads the first rows of each tensor", "src/agentrl/models.py",
           "start = min(param.device_mesh.get_local_rank() * chunk, param.shape[0])", "start = 0",
           ["test_distributed.py"]),
    Mutant("layout: an estimator imports the trainer back", "src/agentrl/advantages/nthr.py",
           "from agentrl.components import Component, StepBatch\n",
           "from agentrl.components import Component, StepBatch\nimport agentrl.trainer  # noqa\n", ["test_layout.py"]),
    Mutant("compare: a finished run reused whatever its settings", "src/agentrl/compare.py",
           'if not phases.reusable("run", settings, (run_dir / "config.yaml").is_file()):',
           'if not (run_dir / "phases.json").is_file():', ["test_compare.py"]),
    # --- prefix packing ----------------------------------------------------------------------------
    Mutant("packing: a token attends to every earlier column of its row (other responses, other prompts)",
           "src/agentrl/actor/batch.py", "((key <= query) & (query < subtree_end[:, None, :]))",
           "((key <= query) & (subtree_end[:, None, :] > 0))", PACKING),
    Mutant("packing: a subtree ends at its first child's end, not its last descendant's", "src/agentrl/actor/batch.py",
           "end[parent[column]] = max(end[parent[column]], end[column])", "end[parent[column]] = end[column]", PACKING),
    Mutant("packing: no gradient flows into the prompt tokens", "src/agentrl/actor/single.py",
           "        return hidden.flatten(0, 1)[batch.predict]",
           "        return torch.where((~batch.mask)[..., None], hidden.detach(), hidden).flatten(0, 1)[batch.predict]",
           PACKING),
    Mutant("packing: a response's positions restart at 0", "src/agentrl/actor/batch.py",
           "ids[column], position[column] = s.ids[t], t",
           "ids[column], position[column] = s.ids[t], (t - size if t >= size else t)", PACKING),
    Mutant("packing: a response's first token predicted from its own column", "src/agentrl/actor/batch.py",
           "r * width + columns[t - 1]", "r * width + columns[t - (t > size)]", PACKING),
    Mutant("packing: a sample shares the whole of the previous sample's prefix path, not their common part",
           "src/agentrl/actor/batch.py", "columns = path[:shared] + list(range(n, n + len(s.ids) - shared))",
           "columns = path[:size] + list(range(n, n + len(s.ids) - len(path[:size])))", PACKING),
    Mutant("packing: a sample's first new column left unwritten", "src/agentrl/actor/batch.py",
           "for t in range(len(columns) - (columns[-1] + 1 - filled), len(columns)):",
           "for t in range(len(columns) - (columns[-1] - filled), len(columns)):", PACKING),
    Mutant("packing: a sample joins a row whenever it fits, whatever the longer row's attention costs",
           "src/agentrl/actor/batch.py", "used + extra <= max_row and grows < n + pair_cost * n ** 2",
           "used + extra <= max_row", PACKING),
    Mutant("packing: the pair cost counts one flop per query-key pair and head dimension, not 4",
           "src/agentrl/actor/batch.py", "return cls(4 * heads * head_dim / (2 * weights))",
           "return cls(heads * head_dim / (2 * weights))", PACKING),
    Mutant("shared decode: a prompt's cache gathered from another prompt's columns",
           "src/agentrl/sampler/shared_decode.py", "r, columns = found[id(sample)]",
           "r, columns = found[id(samples[(j + 1) % len(samples)])]", ["test_actor.py"]),
    Mutant("shared decode: a shorter prompt's padding columns attended", "src/agentrl/sampler/shared_decode.py",
           '[:, None, None].to(device), float("-inf"))', "[:, None, None].to(device), 0.0)", ["test_actor.py"]),
    Mutant("shared decode: the prefill tree numbers positions along its row, not per prompt",
           "src/agentrl/sampler/shared_decode.py", "position_ids=tree.position_ids, past_key_values=computed",
           "past_key_values=computed", ["test_actor.py"]),
    Mutant("shared decode: the prefill tree's prompts attend to every earlier column",
           "src/agentrl/sampler/shared_decode.py", "attention_mask=tree_attention(model, tree.subtree_end)",
           "attention_mask=None", ["test_actor.py"]),
    Mutant("shared decode: every sample reads its own copy of its prompt's cache",
           "src/agentrl/sampler/shared_decode.py", "per = max(1, QUERIES // groups_per_head)", "per = 1",
           ["test_actor.py"]),
    Mutant("shared decode: the prompt's and the sample's attention summed without their maxima",
           "src/agentrl/sampler/shared_decode.py", "mixed = (out * a + own_out * b) / (total * a +",
           "mixed = (out + own_out * b) / (total +", ["test_actor.py"]),
    Mutant("shared decode: a new token does not see itself", "src/agentrl/sampler/shared_decode.py",
           "scores = (query @ own_keys[index][alive, :, :t + 1]", "scores = (query @ own_keys[index][alive, :, :t]",
           ["test_actor.py"]),
    Mutant("shared decode: every step at the last prompt token's position", "src/agentrl/sampler/shared_decode.py",
           "rotary = decoder.rotary_emb(hidden, (positions[alive] + t)[:, None])",
           "rotary = decoder.rotary_emb(hidden, positions[alive][:, None])", ["test_actor.py"]),
    Mutant("shared decode: a finished row's position given to the next live row",
           "src/agentrl/sampler/shared_decode.py", "(positions[alive] + t)[:, None]", "(positions[:n] + t)[:, None]",
           ["test_actor.py"]),
    Mutant("shared decode: a live row's keys written where a finished row's were",
           "src/agentrl/sampler/shared_decode.py", "own_keys[index][alive, :, t] = k[:, :, 0]",
           "own_keys[index][:n, :, t] = k[:, :, 0]", ["test_actor.py"]),
    Mutant("shared decode: log-probs without the temperature", "src/agentrl/sampler/shared_decode.py",
           "torch.log_softmax(logits / temperature, -1)", "torch.log_softmax(logits, -1)", ["test_actor.py"]),
    Mutant("shared decode: nucleus sampling ignored", "src/agentrl/sampler/shared_decode.py",
           "    if not greedy and params.top_p < 1.0:", "    if False:", ["test_actor.py"]),
    # --- provenance --------------------------------------------------------------------------------
    Mutant("provenance: a redone RL keeps the stale run's checkpoints", "src/agentrl/pipeline.py",
           "            shutil.rmtree(rl_dir, ignore_errors=True)  # steps taken with other settings\n", "", ["test_plugins.py"]),
    Mutant("provenance: plugin source not hashed", "src/agentrl/provenance.py",
           "digest.update(file.read_bytes())", 'digest.update(b"")', ["test_plugins.py"]),
    Mutant("provenance: RL reused after an SFT change", "src/agentrl/pipeline.py",
           'upstream = {**plan["sft_settings"], "sft.fingerprint": folder_fingerprint(model_path)}',
           'upstream = {"sft.fingerprint": None}', ["test_plugins.py"]),
    # --- documentation and built-ins as plugins ----------------------------------------------------
    Mutant("docs: a config field without a docstring goes into the reference", "docs/gen_reference.py",
           "if not field.description:", "if False:", ["test_docs.py"]),
    Mutant("docs: the reference lists the plugins loaded in the generating process", "docs/gen_reference.py",
           "return [name for name in registry.names() if ours(name)]", "return registry.names()", ["test_docs.py"]),
    Mutant("docs: the tables of the docs pages are never checked", "benchmarks/readme_tables.py",
           'return [root / "README.md", *sorted((root / "docs").rglob("*.md"))]', 'return [root / "README.md"]',
           ["test_readme_tables.py"]),
    Mutant("stats: the t-interval takes the normal quantile (too narrow at few seeds)", "src/agentrl/stats.py",
           "stats.t.ppf(0.5 + confidence / 2, len(values) - 1)", "stats.norm.ppf(0.5 + confidence / 2)", COMPARE),
    Mutant("pipeline: `agentrl data` needs the sft section a recipe may lack", "src/agentrl/pipeline.py",
           "sft_config = config.sft or SFTConfig()", "sft_config = config.sft", ["test_cli.py"]),
    Mutant("pipeline: skipping the initial evaluation counts as a changed evaluation setting",
           "src/agentrl/pipeline.py", 'EVAL_GUARDS = ("eval.max_aborted_share", "eval.initial")',
           'EVAL_GUARDS = ("eval.max_aborted_share",)', ["test_cli.py"]),
    Mutant("config: a default changed when its class moved (GAGPO's lambda)", "src/agentrl/advantages/gagpo.py",
           "lam: float = Field(0.8, ge=0, le=1)", "lam: float = Field(0.9, ge=0, le=1)", ["test_config.py"]),
    Mutant("gcd: evaluation's parse rate counts the verdicts that did not parse", "src/agentrl/losses/gcd.py",
           '"verdict_parse_rate": statistics.fmean(v is not None for v in verdicts)',
           '"verdict_parse_rate": statistics.fmean(v is None for v in verdicts)', GCD),
    Mutant("registry: a default section is the first entry's, not the named one's", "src/agentrl/registry.py",
           "return self.config({self.key: name, **settings}, name)",
           "return self.config({**settings}, self.names()[0])", ["test_config.py"]),
    Mutant("critic: a distinct prompt's value handed to the samples in batch order, not by prompt", "src/agentrl/critic.py",
           "[index[tuple(ids)] for ids in prompts]", "[min(i, len(distinct) - 1) for i in range(len(prompts))]",
           ["test_trainer.py"]),
    Mutant("scienceworld: train_task_types ignored", "src/agentrl/envs/scienceworld/env.py",
           "pairs = [(t, v) for t, v in pairs if t in kept]", "pairs = list(pairs)", ["test_scienceworld.py"]),
    Mutant("init: the tokenizer corpus file ignored (expert episodes played instead)", "src/agentrl/models.py",
           "for m in messages] if tiny.corpus", "for m in messages] if False", ["test_models.py"]),
    Mutant("data: expert data reused whatever the settings it was made with", "src/agentrl/pipeline.py",
           "if phases.reusable(name, settings, out.is_file()):", "if out.is_file():", ["test_cli.py"]),
    Mutant("phases: a setting added since, at its old behaviour, redoes the phase", "src/agentrl/provenance.py",
           "return previous is not None and not changes(previous, settings)",
           "return previous == settings", ["test_cli.py"]),
    Mutant("phases: a setting added since at a value other than its old behaviour reuses the phase",
           "src/agentrl/provenance.py", 'OLD_BEHAVIOUR = {"rl.mini_batch_order": "shuffled"}',
           'OLD_BEHAVIOUR = {"rl.mini_batch_order": "grouped"}', ["test_cli.py"]),
    Mutant("compare: --metric return compares success", "src/agentrl/compare.py",
           'float(t.success) if metric == "success" else sum(s.reward for s in t.steps)', "float(t.success)", COMPARE),
    Mutant("compare: a return shown in hundredths, as success is", "src/agentrl/compare.py",
           'its final score)", 1.0)}', 'its final score)", 100.0)}', COMPARE),
    Mutant("pipeline: the RL phase kept only when its record equals the settings exactly", "src/agentrl/pipeline.py",
           'if not phases.same("rl", settings):', 'if phases.done.get("rl") != settings:', ["test_cli.py"]),
    Mutant("mini-batches: rl.mini_batch_order grouped ignored", "src/agentrl/trainer.py",
           'if rl.mini_batch_order == "grouped" else None', 'if False else None', ["test_trainer.py"]),
    Mutant("mini-batches: task groups dealt in the same order every step", "src/agentrl/trainer.py",
           "    order = list(members)\n    rng.shuffle(order)\n", "    order = list(members)\n", ["test_trainer.py"]),
    Mutant("eval: mean return averaged over steps, not episodes", "src/agentrl/evaluate.py",
           "sum(s.reward for s in steps) / max(n, 1)", "sum(s.reward for s in steps) / max(len(steps), 1)", EVAL),
    Mutant("env pool: a worker's time limit is one environment's, whatever the number it runs",
           "src/agentrl/envs/pool.py", "self.timeouts[command] * len(slots)", "self.timeouts[command]", ["test_pool.py"]),
    Mutant("scienceworld: a split lists each task type's variations together (a prefix misses types)",
           "src/agentrl/envs/scienceworld/env.py",
           "return [pair for turn in itertools.zip_longest(*by_task.values()) for pair in turn if pair is not None]",
           "return pairs", ["test_scienceworld.py"]),
]


def run(mutant: Mutant, root: Path, timeout: int) -> tuple[str, float, str]:
    path = root / mutant.path
    original = path.read_text()
    if mutant.old not in original:
        return "n/a", 0.0, ""
    tests = [str(root / "tests" / t) for t in dict.fromkeys(mutant.tests) if (root / "tests" / t).exists()]
    path.write_text(original.replace(mutant.old, mutant.new, 1))
    start = time.perf_counter()
    try:
        python = str(VLLM_PY) if "test_vllm.py" in mutant.tests else sys.executable
        proc = subprocess.run([python, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *tests],
                              cwd=root, capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, "PYTHONPATH": str(root / "src")})
        failed = [line for line in proc.stdout.splitlines() if line.startswith(("FAILED", "ERROR"))]
        status = "killed" if proc.returncode == 1 else "survived" if proc.returncode == 0 else f"error {proc.returncode}"
        detail = failed[0] if failed else ""
    except subprocess.TimeoutExpired:
        status, detail = "killed (timeout)", ""
    finally:
        path.write_text(original)
    return status, time.perf_counter() - start, detail


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[1])
    parser.add_argument("--only", default="")
    parser.add_argument("--timeout", type=int, default=1200)
    args = parser.parse_args()
    results = []
    for mutant in MUTANTS:
        if args.only not in mutant.name:
            continue
        status, seconds, detail = run(mutant, args.root.resolve(), args.timeout)
        results.append(status)
        print(f"{status:>10}  {seconds:6.0f} s  {mutant.name}  {detail}", flush=True)
    applicable = [s for s in results if s != "n/a"]
    killed = sum(s.startswith("killed") for s in applicable)
    print(f"killed {killed} of {len(applicable)} applicable mutants ({len(results) - len(applicable)} n/a)")
    return 0 if killed == len(applicable) else 1


if __name__ == "__main__":
    sys.exit(main())
