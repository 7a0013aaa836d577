"""The RL loop: rollout -> rewards -> advantages -> PPO update, one environment step per sample.

The trainer is algorithm-blind: the advantage estimator, the policy loss and any auxiliary losses
come from registries chosen in the config. Each step draws its tasks, its mini-batch order and
its sampling randomness from (seed, step), so a resumed run continues exactly like an
uninterrupted one.
"""

from __future__ import annotations

import random
import statistics
import time
from pathlib import Path

import torch

from agentrl import distributed
from agentrl.actor.batch import TrainSample, budget_chunks, micro_batches
from agentrl.actor.single import SingleActor, response_logprobs
from agentrl.advantages import compute_advantages
from agentrl.advantages.nthr import apply_nthr
from agentrl.analysis.coupling import coupling_metrics
from agentrl.checkpoint import latest_checkpoint, read_state, save_checkpoint
from agentrl.critic import Critic
from agentrl.envs.base import sample_tasks
from agentrl.envs.pool import EnvPool
from agentrl.evaluate import evaluate
from agentrl.gcd.correction import PromptCorrection
from agentrl.losses.gcd import ClassifierJudgeLoss, GCDLoss
from agentrl.losses.policy import aggregation_weights
from agentrl.models import add_lora, load_model, load_tokenizer
from agentrl.progress import progress
from agentrl.registry import ACTORS, AUX_LOSSES, KL_ESTIMATORS, POLICY_LOSSES, SAMPLERS
from agentrl.rollout.collect import collect
from agentrl.tracking import Tracker


def step_seed(seed: int, step: int, purpose: str) -> int:
    return random.Random(f"{seed}:{step}:{purpose}").getrandbits(63)


def rollout_metrics(trajectories) -> dict[str, float]:
    steps = [s for t in trajectories for s in t.steps]
    n = max(len(trajectories), 1)
    return {
        "rollout/success": sum(t.success for t in trajectories) / n,
        "rollout/episode_reward": sum(t.episode_reward for t in trajectories) / n,
        "rollout/length": len(steps) / n,
        "rollout/invalid_rate": sum(not s.valid for s in steps) / max(len(steps), 1),
        "rollout/repeated_rate": sum(t.repeated_actions for t in trajectories) / max(len(steps), 1),
        "rollout/response_tokens": statistics.fmean(len(s.response_ids) for s in steps) if steps else 0.0,
        "rollout/aborted": float(sum(t.aborted for t in trajectories)),
        "rollout/dropped_groups": float(len({t.group_id for t in trajectories if t.aborted})),
    }


def advantage_metrics(values: list[float]) -> dict[str, float]:
    if len(values) < 2:
        return {}
    q1, _, q3 = statistics.quantiles(values, n=4)
    return {"adv/mean": statistics.fmean(values), "adv/std": statistics.stdev(values), "adv/iqr": q3 - q1,
            "adv/frac_abs_gt1": sum(abs(v) > 1 for v in values) / len(values)}


def value_metrics(values: list[float], returns: list[float]) -> dict[str, float]:
    """The critic's V before its update against the GAE targets: explained variance
    1 - Var(R - V) / Var(R) (1 is perfect, 0 no better than a constant)."""
    if len(values) < 2:
        return {}
    var = statistics.pvariance(returns)
    residual = statistics.pvariance([r - v for r, v in zip(returns, values)])
    return {"critic/value_mean": statistics.fmean(values), "critic/return_mean": statistics.fmean(returns),
            "critic/explained_variance": 1 - residual / var if var > 0 else 0.0}


class RLTrainer:
    def __init__(self, config, model_path: str, run_dir: Path, aux_losses=None):
        self.config, self.rl, self.run_dir = config, config.rl, Path(run_dir)
        self.tokenizer = load_tokenizer(model_path)
        self.model = self._load_policy(model_path)
        self.world, self.rank = distributed.world(), distributed.rank()
        if self.rl.tasks_per_step % self.world:
            raise ValueError(f"rl.tasks_per_step ({self.rl.tasks_per_step}) must be a multiple of the "
                             f"number of ranks ({self.world}): a task group never spans ranks")
        sharded = self.rl.actor.backend != "single"
        # A sharded actor cannot generate: each rank's sampler holds a full copy of the weights.
        self.sampler = SAMPLERS.get(self.rl.sampler.type)(
            self.rl.sampler, model_path, lambda: self._load_policy(model_path) if sharded else self.model,
            self.tokenizer, config)
        # The full HF policy that NTHR, the coupling lab and the LoRA reference read.
        self.policy = self.model if not sharded else getattr(self.sampler, "model", None)
        # The KL reference: the frozen initial model, or with LoRA the same weights with the
        # adapters switched off (no second copy).
        self.use_reference = self.rl.kl_coef > 0
        self.reference = None
        if self.use_reference and getattr(self.rl.actor, "lora", None) is None:
            self.reference = load_model(model_path, config.model.dtype).eval().requires_grad_(False)
        self.critic = None
        if self.rl.advantage.type == "ppo":
            self.critic = Critic(self.rl.advantage.critic_path or model_path, self.rl.advantage,
                                 config.model.dtype, self.tokenizer.pad_token_id)
        self.pool = EnvPool(config.env, self.rl.workers, self.rl.env_step_timeout_s, self.rl.env_reset_timeout_s)
        self.aux_losses = list(aux_losses) if aux_losses is not None else [
            AUX_LOSSES.get(aux.type)(aux, self.model, self.sampler, self.tokenizer, config.seed) for aux in self.rl.aux]
        self.parts = {"critic": self.critic} if self.critic is not None else {}
        extra_parameters = []
        for aux in self.aux_losses:
            if isinstance(aux, ClassifierJudgeLoss):
                self.parts[aux.name] = aux
                extra_parameters += aux.head.parameters()
        self.actor = ACTORS.get(self.rl.actor.backend)(self.rl.actor, self.model, self.rl.optim, extra_parameters)
        self.sampler.update_weights(self.actor.weights())  # a no-op for a sampler sharing the actor's module
        self.judge = next((a for a in self.aux_losses if isinstance(a, (GCDLoss, ClassifierJudgeLoss))), None)
        self.correction = None
        if isinstance(self.judge, GCDLoss) and self.judge.config.correction is not None:
            self.correction = PromptCorrection(self.judge.config.correction, self.judge, self.sampler,
                                               self.tokenizer, self.judge.endpoint, self.run_dir / "correction.jsonl")
        self.step = 0

    def close(self) -> None:
        self.pool.close()

    def __enter__(self) -> RLTrainer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _load_policy(self, path: str):
        model = load_model(path, self.config.model.dtype)
        lora = getattr(self.rl.actor, "lora", None)
        if lora is not None:
            torch.manual_seed(self.config.seed)  # the adapters' initialisation
            model = add_lora(model, lora)
        return model

    # --- one training step -----------------------------------------------------------------------
    def train_step(self) -> dict[str, float]:
        """Rollouts of this rank's share of the step's tasks, then one update on them."""
        step, timing = self.step + 1, {}
        started = time.perf_counter()
        trajectories = self.rollout(step, timing)
        metrics = self.learn(trajectories, step, timing)
        self.step = step
        metrics["timing_s/step"] = time.perf_counter() - started
        # Rollout, advantage and timing statistics are per rank: averaged over the ranks.
        # (Actor totals and token counts are already global.)
        return distributed.mean_metrics(metrics)

    def rollout(self, step: int, timing: dict | None = None) -> list:
        """This rank's trajectories of training step `step` (1-based): every rank draws the same
        task list and plays its own contiguous share of it."""
        rl, cfg = self.rl, self.config
        tasks = sample_tasks(self.pool.local, "train", rl.tasks_per_step, random.Random(step_seed(cfg.seed, step, "tasks")))
        share = rl.tasks_per_step // self.world
        torch.manual_seed(step_seed(cfg.seed, step, "sampling" if self.world == 1 else f"sampling:{self.rank}"))
        hint = self.correction.refresh(step) if self.correction else ""
        return collect(self.pool, self.sampler, self.tokenizer, tasks[self.rank * share:(self.rank + 1) * share],
                       rl.group_size, cfg.prompt, cfg.sampling,
                       first_group_id=(step - 1) * rl.tasks_per_step + self.rank * share, timing=timing, hint=hint)

    def learn(self, trajectories: list, step: int, timing: dict | None = None) -> dict[str, float]:
        """Score, advantages and one update (all ranks together) on this rank's `trajectories`;
        sets each usable step's `advantage`. Returns this rank's metrics."""
        rl, cfg = self.rl, self.config
        timing = timing if timing is not None else {}
        # An aborted episode leaves its group: the group baseline of the others would be biased
        # (a crash can correlate with the outcome), so the whole group sits this step out.
        broken = {t.group_id for t in trajectories if t.aborted}
        usable = [t for t in trajectories if t.group_id not in broken]
        extra_metrics: dict[str, float] = {}
        steps = [s for t in usable for s in t.steps]
        samples = [TrainSample.from_turn(s.prompt_ids, s.response_ids, old_logprobs=s.logprobs) for s in steps]
        if self.use_reference:
            start = time.perf_counter()
            self._add_reference_logprobs(samples)
            timing["ref"] = time.perf_counter() - start
            if rl.kl_in_reward:  # KL(sampler || ref) of each action becomes part of its step penalty
                kl = KL_ESTIMATORS.get(rl.kl_estimator)
                penalties = [rl.kl_coef * kl(torch.tensor(sample.values["old_logprobs"]),
                                             torch.tensor(sample.values["ref_logprobs"])).sum().item()
                             for sample in samples]
                for step_sample, penalty in zip(steps, penalties):
                    step_sample.penalty += penalty
                extra_metrics["rollout/kl_penalty"] = statistics.fmean(penalties) if penalties else 0.0
        if self.critic is not None:
            start = time.perf_counter()
            values = self.critic.values([s.prompt_ids for s in steps], rl.micro_batch_tokens)
            for step_sample, value in zip(steps, values):
                step_sample.value = value
            timing["critic_values"] = time.perf_counter() - start
        start = time.perf_counter()
        advantages = compute_advantages(usable, rl.advantage)
        timing["advantage"] = time.perf_counter() - start
        for step_sample, sample, a in zip(steps, samples, (a for values in advantages.values for a in values)):
            step_sample.advantage = a
            sample.values["advantages"] = [a] * sample.n_targets
        if rl.nthr is not None:
            start = time.perf_counter()
            extra_metrics.update(apply_nthr(self.policy, samples, [t.group_id for t in usable for _ in t.steps],
                                            rl.nthr, cfg.sampling.temperature or 1.0,
                                            self.tokenizer.pad_token_id, rl.micro_batch_tokens))
            timing["nthr"] = time.perf_counter() - start
        if rl.coupling_every and step % rl.coupling_every == 0:
            start = time.perf_counter()
            found = coupling_metrics(self.policy, self.tokenizer, usable, rl.coupling_pairs, rl.coupling_lr,
                                     step_seed(cfg.seed, step, "coupling"))
            extra_metrics.update({f"coupling/{k}": v for k, v in found.items()})
            timing["coupling"] = time.perf_counter() - start
        start = time.perf_counter()
        aux_batches = {aux.name: aux.prepare(usable, step) for aux in self.aux_losses}
        aux_samples = {name: b.samples for name, b in aux_batches.items()}
        if self.aux_losses:
            timing["aux_prepare"] = time.perf_counter() - start

        start = time.perf_counter()
        self.sampler.sleep()  # (vLLM on a GPU) its memory is the actor's until the weights are pushed
        totals: dict[str, float] = {}
        order = random.Random(step_seed(cfg.seed, step, "shuffle"))
        n_samples = int(distributed.all_sum([len(samples)])[0])
        n_chunks = -(-n_samples // rl.mini_batch_size)
        for _ in range(rl.epochs):
            order.shuffle(samples)
            for k, chunk in enumerate(mini_batch_split(samples, rl.mini_batch_size, n_chunks, self.world)):
                lengths = [s.n_targets for s in chunk]
                weights = aggregation_weights(lengths, rl.loss_agg, distributed.all_sum([sum(lengths), len(lengths)]))
                for s, w in zip(chunk, weights):
                    s.values["agg_weight"] = [w] * s.n_targets
                parts = [(micro_batches(chunk, rl.micro_batch_tokens, self.tokenizer.pad_token_id),
                          self._policy_loss())] if chunk else []
                for aux in self.aux_losses:
                    share = aux_samples[aux.name][k::n_chunks]
                    aux_tokens = distributed.all_sum([sum(s.n_targets for s in share)])[0]
                    if share:
                        parts.append((micro_batches(share, rl.micro_batch_tokens, self.tokenizer.pad_token_id),
                                      self._aux_loss(aux, aux_tokens)))
                for key, value in self.actor.optimizer_step(parts).items():
                    totals[key] = totals.get(key, 0.0) + value
        timing["update"] = time.perf_counter() - start
        if self.critic is not None and steps:
            start = time.perf_counter()
            returns = [r for values in advantages.returns for r in values]
            old_values = [s.value for s in steps]
            critic_metrics = self.critic.update([s.prompt_ids for s in steps], returns, old_values,
                                                rl.mini_batch_size, rl.micro_batch_tokens,
                                                random.Random(step_seed(cfg.seed, step, "critic")))
            extra_metrics.update({f"critic/{k}": v for k, v in critic_metrics.items()})
            extra_metrics.update(value_metrics(old_values, returns))
            timing["critic_update"] = time.perf_counter() - start
        self.sampler.update_weights(self.actor.weights())

        n_updates = max(1, rl.epochs * n_chunks)
        n_tokens = rl.epochs * distributed.all_sum([sum(s.n_targets for s in samples)])[0]
        metrics = rollout_metrics(trajectories) | extra_metrics
        metrics.update(advantage_metrics([a for values in advantages.values for a in values]))
        metrics.update({f"adv/{k}": v for k, v in advantages.metrics.items()})
        for key, value in totals.items():
            if key in ("lr", "grad_norm"):
                metrics[f"actor/{key}"] = value / n_updates
            elif key.startswith("aux/"):
                metrics[key] = value / n_updates
            else:
                metrics[f"actor/{key}"] = value / max(n_tokens, 1)
        for name, batch in aux_batches.items():
            metrics.update({f"aux/{name}/{k}": v for k, v in batch.metrics.items()})
        metrics["tokens/processed"] = rl.epochs * distributed.all_sum([sum(len(s.ids) for s in samples)])[0]
        metrics["tokens/response"] = float(n_tokens / rl.epochs)
        metrics.update({f"timing_s/{k}": v for k, v in timing.items()})
        return metrics

    def _policy_loss(self):
        rl, temperature = self.rl, self.config.sampling.temperature or 1.0
        loss_impl = POLICY_LOSSES.get(rl.loss.type)

        def loss_fn(batch):
            logp, entropy = self.actor.token_logprobs(batch, temperature, entropy=True)
            v = batch.values
            weight = v["agg_weight"]  # (N,): rl.loss_agg over the whole mini-batch
            pg, counts = loss_impl(logp, v["old_logprobs"], v["advantages"], batch.sample_index, rl.loss)
            total = (weight * pg).sum()
            # ppo_kl: mean of log(old / new) per token; ~0 on the first mini-batch of an update,
            # where the actor must score the sampled tokens exactly as the sampler did.
            metrics = {"pg_loss": pg.sum().detach(), "entropy": entropy.sum().detach(),
                       "ppo_kl": (v["old_logprobs"] - logp).sum().detach(),
                       **{k: c.detach() for k, c in counts.items()}}
            if self.use_reference and not rl.kl_in_reward:
                kl = KL_ESTIMATORS.get(rl.kl_estimator)(logp, v["ref_logprobs"])
                total = total + rl.kl_coef * (weight * kl).sum()
                metrics["kl"] = kl.sum().detach()
            if rl.entropy_coef:
                total = total - rl.entropy_coef * (weight * entropy).sum()
            return total, metrics
        return loss_fn

    def _aux_loss(self, aux, n_tokens: int):
        def loss_fn(batch):
            metrics = {}
            if getattr(aux, "uses_hidden", False):
                per_token, counts = aux.hidden_loss(self.actor.token_hidden(batch), batch.values)
                metrics = {f"aux/{aux.name}/{k}": v / n_tokens for k, v in counts.items()}
            else:
                per_token = aux.token_loss(self.actor.token_logprobs(batch)[0], batch.values)
            loss = per_token.sum() / n_tokens
            return aux.weight * loss, {f"aux/{aux.name}/loss": loss.detach(), **metrics}
        return loss_fn

    def _extra_state(self) -> dict:
        """Run state beyond weights and optimiser that a resumed run needs to continue exactly."""
        extra = {}
        if self.judge is not None:
            extra["critiques"] = self.judge.critiques
        if self.correction is not None:
            extra["hint"] = self.correction.hint
        return extra

    @torch.no_grad()
    def _add_reference_logprobs(self, samples: list[TrainSample]) -> None:
        temperature = self.config.sampling.temperature or 1.0
        by_id = {id(s): s for s in samples}
        for batch_samples in budget_chunks(samples, self.rl.micro_batch_tokens):
            batch = micro_batches(batch_samples, 10**12, self.tokenizer.pad_token_id)[0]
            if self.reference is not None:
                logp, _ = response_logprobs(self.reference, batch, temperature)
            else:
                with self.policy.disable_adapter():
                    logp, _ = response_logprobs(self.policy, batch, temperature)
            offset = 0
            for s in sorted(batch_samples, key=lambda x: len(x.ids), reverse=True):
                by_id[id(s)].values["ref_logprobs"] = logp[offset:offset + s.n_targets].tolist()
                offset += s.n_targets

    def evaluate(self) -> dict:
        """The policy now, on the evaluation splits (written to eval/step_N)."""
        cfg = self.config
        return evaluate(self.pool, self.sampler, self.tokenizer, cfg.eval, cfg.prompt, cfg.seed,
                        self.run_dir / "eval" / f"step_{self.step:06d}", judge=self.judge)

    # --- the loop ----------------------------------------------------------------------------------
    def run(self, resume: bool = False) -> dict:
        """Train to `rl.steps` (from the last checkpoint when resuming); the final evaluation."""
        rl, cfg = self.rl, self.config
        if resume:
            ckpt = latest_checkpoint(self.run_dir)
            if ckpt is not None:
                self.actor.load(ckpt)
                self.sampler.update_weights(self.actor.weights())  # a separate sampler copy too
                for name, part in self.parts.items():
                    part.load(ckpt / name)
                state = read_state(ckpt)
                self.step = state["step"]
                if self.judge is not None:
                    self.judge.critiques = [tuple(c) for c in state.get("critiques", [])]
                if self.correction is not None:
                    self.correction.hint = state.get("hint", "")
        main = distributed.is_main()  # with several ranks, rank 0 evaluates, logs and reports
        tracker = Tracker(self.run_dir / "logs", resume_step=self.step) if main else None
        results = {}
        try:
            with progress(disable=not main) as bar:
                task = bar.add_task("RL", total=rl.steps, completed=self.step)
                while self.step < rl.steps:
                    metrics = self.train_step()
                    last = self.step == rl.steps
                    if main and ((rl.eval_every and self.step % rl.eval_every == 0) or last):
                        results = self.evaluate()
                        for split, r in results.items():
                            metrics[f"eval/{split}/success"] = r["success"]
                            if "judge_accuracy" in r:
                                metrics[f"eval/{split}/judge_accuracy"] = r["judge_accuracy"]
                    distributed.barrier()
                    if tracker is not None:
                        tracker.log(self.step, metrics)
                    if (rl.save_every and self.step % rl.save_every == 0) or last:
                        save_checkpoint(self.run_dir, self.step, self.actor, self.tokenizer, self._extra_state(),
                                        rl.keep_last, self.parts)
                    bar.update(task, completed=self.step, description=(
                        f"RL success {metrics['rollout/success']:.2f} len {metrics['rollout/length']:.1f}"))
            if main and not results:  # resumed at the last step: the final evaluation again
                results = self.evaluate()
        finally:
            if tracker is not None:
                tracker.close()
        return results


def mini_batch_split(samples: list, size: int, n_chunks: int, world: int) -> list[list]:
    """This rank's part of each of the step's `n_chunks` mini-batches: slices of `size` in one
    process; with several ranks, each rank's samples in `n_chunks` near-equal contiguous parts."""
    if world == 1:
        return [samples[i:i + size] for i in range(0, len(samples), size)]
    bounds = [round(i * len(samples) / n_chunks) for i in range(n_chunks + 1)]
    return [samples[a:b] for a, b in zip(bounds, bounds[1:])]
