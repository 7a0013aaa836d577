"""The RL loop: rollout -> score -> advantages -> update, one environment step per sample.

The trainer is algorithm-blind: the advantage estimator, the policy loss, the KL estimator, the
sampler and the actor backend come from registries (`agentrl.registry`) chosen in the config, and
everything else a method adds (reference log-probs, reward terms, a critic, token reweighting,
measurements, auxiliary losses, prompt hints) attaches as a component whose hooks run at fixed
points of the step (`agentrl.components`). Each step draws its tasks, its mini-batch order and its
sampling randomness from (seed, step), so a resumed run continues exactly like an uninterrupted one.
"""

from __future__ import annotations

import random
import statistics
import time
from functools import cached_property
from pathlib import Path

import torch

from agentrl import distributed
from agentrl.actor import check_launch, shards_on_load
from agentrl.actor.base import Actor
from agentrl.advantages import compute_advantages
from agentrl.checkpoint import export_final, latest_checkpoint, read_state, save_checkpoint
from agentrl.components import Component, Context, StepBatch, timed
from agentrl.config import ConfigError
from agentrl.envs.pool import EnvPool
from agentrl.errors import RunError
from agentrl.evaluate import evaluate
from agentrl.losses.aux import aux_part
from agentrl.losses.policy import aggregation_weights
from agentrl.losses.step import StepLoss, sampler_check, sampler_gap
from agentrl.metrics import Tally
from agentrl.models import load_policy, load_tokenizer
from agentrl.packing import Packing, TrainSample, micro_batches, per_sample
from agentrl.progress import plain_output, progress, set_stage
from agentrl.registry import ACTORS, ADVANTAGES, AUX_LOSSES, COMPONENTS, SAMPLERS
from agentrl.rollout.ahead import Ahead
from agentrl.rollout.collect import play_step
from agentrl.rollout.records import write_trajectories
from agentrl.rollout.types import differing_groups, group_by_id
from agentrl.sampler.base import Sampler
from agentrl.seeding import step_seed
from agentrl.tracking import Tracker


def check_ranks(rl, world: int) -> None:
    """ConfigError unless the RL settings work on `world` ranks."""
    check_launch(rl.actor, "rl.actor", world)
    if rl.tasks_per_step % world:
        raise ConfigError(f"rl.tasks_per_step ({rl.tasks_per_step}) must be a multiple of the number of ranks "
                          f"({world}): a task group never spans ranks")


def rollout_metrics(trajectories) -> dict[str, float]:
    steps = [s for t in trajectories for s in t.steps]
    n = max(len(trajectories), 1)
    broken = {t.group_id for t in trajectories if t.aborted}
    uniform = len(group_by_id(trajectories)) - len(broken) - len(differing_groups(trajectories))
    by_type: dict[str, list[bool]] = {}
    for t in trajectories:
        by_type.setdefault(t.task_type, []).append(t.success)
    return {
        "rollout/success": sum(t.success for t in trajectories) / n,
        "rollout/episode_reward": sum(t.episode_reward for t in trajectories) / n,
        "rollout/length": len(steps) / n,
        "rollout/invalid_rate": sum(not s.valid for s in steps) / max(len(steps), 1),
        "rollout/rejected_per_step": sum(s.rejected for s in steps) / max(len(steps), 1),
        "rollout/repeated_rate": sum(t.repeated_actions for t in trajectories) / max(len(steps), 1),
        "rollout/response_tokens": statistics.fmean(len(s.response_ids) for s in steps) if steps else 0.0,
        "rollout/aborted": float(sum(t.aborted for t in trajectories)),
        "rollout/context_ended": float(sum(t.context_ended for t in trajectories)),
        "rollout/dropped_groups": float(len(broken)),
        "rollout/uniform_groups": float(uniform),  # their returns all the same: no group-relative advantage
        **{f"rollout/success/{kind}": statistics.fmean(wins) for kind, wins in sorted(by_type.items())},
    }


def advantage_metrics(values: list[float]) -> dict[str, float]:
    if len(values) < 2:
        return {}
    q1, _, q3 = statistics.quantiles(values, n=4)
    return {"adv/mean": statistics.fmean(values), "adv/std": statistics.stdev(values), "adv/iqr": q3 - q1,
            "adv/frac_abs_gt1": sum(abs(v) > 1 for v in values) / len(values)}


class RLTrainer:
    def __init__(self, config, model_path: str, run_dir: Path):
        self.config, self.rl, self.run_dir, self.model_path = config, config.rl, Path(run_dir), model_path
        self.tokenizer = load_tokenizer(model_path)
        self.model = load_policy(config, model_path, empty=shards_on_load(self.rl.actor))
        self.world, self.rank = distributed.world(), distributed.rank()
        check_ranks(self.rl, self.world)
        sharded = self.rl.actor.backend != "single"
        # A sharded actor cannot generate: each rank's sampler holds a full copy of the weights.
        self.sampler: Sampler = SAMPLERS.get(self.rl.sampler.type)(
            self.rl.sampler, model_path, lambda: load_policy(config, model_path) if sharded else self.model,
            self.tokenizer, config)
        # The full HF policy that components read (the sampler's copy when the actor is sharded).
        policy = self.model if not sharded else getattr(self.sampler, "model", None)
        self.packing = Packing.for_model(self.model.config) if self.rl.pack_prefixes else None
        self.loss = StepLoss(self.rl, config.sampling.temperature or 1.0)
        self.components, self.aux_losses = build_components(Context(config, model_path, policy, self.sampler,
                                                                    self.tokenizer, self.run_dir, self.packing))
        extra = [p for c in self.components for p in c.parameters()]
        self.actor: Actor = ACTORS.get(self.rl.actor.backend)(self.rl.actor, self.model, self.rl.optim, extra)
        self.sampler.update_weights(self.actor.weights())  # a no-op for a sampler sharing the actor's module
        self.step = 0
        self.trajectories: list = []
        """This rank's trajectories of the last step (with their advantages)."""
        self._skipped_in_a_row = 0
        self.draws = 0
        """Rounds of tasks the last step drew (more than 1 only with rl.rollout.filter_groups)."""
        self.ahead: Ahead | None = None
        """With rl.overlap, the sampler process (started by the first step)."""
        if self.rl.overlap is not None and self.rl.overlap.trainer_threads:
            torch.set_num_threads(self.rl.overlap.trainer_threads)

    def component(self, name: str):
        """The component called `name` (e.g. "critic", "ref", an auxiliary loss's name)."""
        return next(c for c in self.components if c.name == name)

    @cached_property
    def pool(self) -> EnvPool:
        """The environments of this process's rollouts and evaluations, started when first used
        (with rl.overlap only evaluation uses them: the sampler process has its own)."""
        return EnvPool(self.config.rl_env(), self.rl.env_pool)

    def close(self) -> None:
        if self.ahead is not None:
            self.ahead.close()
        if "pool" in self.__dict__:
            self.pool.close()

    def __enter__(self) -> RLTrainer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # --- one training step -----------------------------------------------------------------------
    def train_step(self) -> dict[str, float]:
        """Rollouts of this rank's share of the step's tasks, then one update on them."""
        step, timing = self.step + 1, {}
        set_stage(f"RL step {step}")
        with timed(timing, "step"):
            if self.rl.overlap is None:
                trajectories = self.rollout(step, timing)
            else:
                if self.ahead is None:  # (on resume: the steps ahead sample with the checkpoint's weights)
                    self.ahead = Ahead(self.config, self.model_path)
                    self.ahead.start(step - 1, self.actor.weights(), self.hint)
                trajectories, self.draws = self.ahead.take(step, timing)
            metrics = self.learn(trajectories, step, timing)
            if self.ahead is not None:
                self.ahead.after_update(step, self.actor.weights(), self.hint)
        self.step, self.trajectories = step, trajectories
        metrics["timing_s/step"] = timing["step"]
        metrics["rollout/draws"] = self.draws
        metrics["rollout/staleness"] = statistics.fmean(step - 1 - t.version for t in trajectories) if trajectories else 0.0
        if self.ahead is not None:
            metrics["overlap/sampler_threads"] = self.ahead.sampler_threads
            metrics["overlap/trainer_threads"] = torch.get_num_threads()
        # Rollout, advantage and timing statistics are per rank: averaged over the ranks.
        # (Actor totals and token counts are already global.)
        return distributed.mean_metrics(metrics)

    def rollout(self, step: int, timing: dict | None = None) -> list:
        """This rank's trajectories of training step `step` (1-based), played here (`play_step`)."""
        trajectories, self.draws = play_step(self.pool, self.sampler, self.tokenizer, self.config, step,
                                             self.hint(step), self.rank, self.world, timing)
        for t in trajectories:
            t.version = step - 1
        return trajectories

    def hint(self, step: int) -> str:
        """What the components add to step `step`'s prompts."""
        return "\n".join(h for h in (c.hint(step) for c in self.components) if h)

    def learn(self, trajectories: list, step: int, timing: dict | None = None) -> dict[str, float]:
        """Score, advantages and one update (all ranks together) on this rank's `trajectories`;
        sets each usable step's `advantage`. Returns this rank's metrics."""
        timing = timing if timing is not None else {}
        usable = self._trained(trajectories)
        steps = [s for t in usable for s in t.steps]
        batch = StepBatch(step, usable, steps,
                          [TrainSample.from_turn(s.prompt_ids, s.response_ids, old_logprobs=s.logprobs) for s in steps])
        if self.rl.old_logprobs == "actor":  # the ratio's old log-probs: a forward pass of its own
            with timed(timing, "actor_logprobs"):
                self._actor_old_logprobs(batch)
        self._hook("score", batch, timing)  # reference log-probs, reward terms, critic values
        with timed(timing, "advantage"):
            batch.set_advantages(compute_advantages(usable, self.rl.advantage))
        self._hook("shape", batch, timing)  # per-token reweighting, measurements
        batch.attach_advantages()
        with timed(timing, "aux_prepare"):
            aux_batches = {aux.name: aux.prepare(usable, step) for aux in self.aux_losses}
        self.sampler.sleep()  # (vLLM on a GPU) its memory is the actor's until the weights are pushed
        with timed(timing, "update"):
            tally, n_updates, computed = self._update(batch, aux_batches)
        batch.metrics.update(sampler_gap(tally))
        self._hook("after_update", batch, timing)  # e.g. the critic's regression
        self.sampler.update_weights(self.actor.weights())
        trained = self._tokens(batch)
        return self._metrics(trajectories, batch, aux_batches, tally.report(trained, n_updates), trained,
                             computed, timing)

    def _trained(self, trajectories: list) -> list:
        """The trajectories the update trains on. An aborted episode leaves its group out: the group
        baseline of the others would be biased (a crash can correlate with the outcome). With
        rl.rollout.filter_groups so does a group whose returns are all the same, and the first
        groups of this rank's share are kept."""
        if self.rl.rollout.filter_groups is not None:
            kept = set(differing_groups(trajectories)[:self.rl.tasks_per_step // self.world])
            return [t for t in trajectories if t.group_id in kept]
        broken = {t.group_id for t in trajectories if t.aborted}
        return [t for t in trajectories if t.group_id not in broken]

    def _tokens(self, batch: StepBatch) -> float:
        """The response tokens the update trained (every rank's, every epoch)."""
        return self.rl.epochs * distributed.all_sum([sum(s.n_targets for s in batch.samples)])[0]

    def _metrics(self, trajectories: list, batch: StepBatch, aux_batches: dict, update: dict[str, float],
                 trained: float, computed: int, timing: dict) -> dict[str, float]:
        """The step's metrics: rollouts, hooks, advantages, the update's (actor/*, aux/*), tokens
        (`trained`: the response tokens of every rank and epoch) and throughput, timings."""
        rl, flat = self.rl, [s.advantage for s in batch.steps]
        metrics = rollout_metrics(trajectories) | batch.metrics | advantage_metrics(flat)
        metrics.update({f"adv/{k}": v for k, v in batch.advantages.metrics.items()})
        metrics.update({key if "/" in key else f"actor/{key}": value for key, value in update.items()})
        for name, aux_batch in aux_batches.items():
            metrics.update({f"aux/{name}/{k}": v for k, v in aux_batch.metrics.items()})
        metrics["tokens/processed"] = rl.epochs * distributed.all_sum([sum(len(s.ids) for s in batch.samples)])[0]
        metrics["tokens/computed"] = distributed.all_sum([computed])[0]  # what the update's forward passes ran
        metrics["tokens/response"] = float(trained / rl.epochs)
        # Tokens per second of all ranks together (each rank's time: they work side by side).
        generated = distributed.all_sum([sum(len(s.response_ids) for t in trajectories for s in t.steps)])[0]
        metrics["throughput/gen_tokens_per_s"] = generated / max(timing.get("gen", 0.0), 1e-9)
        metrics["throughput/update_tokens_per_s"] = metrics["tokens/processed"] / max(timing["update"], 1e-9)
        metrics.update({f"timing_s/{k}": v for k, v in timing.items()})
        return metrics

    def _actor_old_logprobs(self, batch: StepBatch) -> None:
        """rl.old_logprobs: actor. The actor's log-probs of the sampled tokens become the PPO
        ratio's old log-probs (and with rl.tis_cap, p_actor / p_sampler capped the TIS weights);
        how far they are from the sampler's is the step's sampler-actor gap."""
        rl, temperature = self.rl, self.config.sampling.temperature or 1.0
        found = per_sample(batch.samples, rl.micro_batch_tokens, self.tokenizer.pad_token_id,
                           lambda batches: self.actor.score_logprobs(batches, temperature), self.packing)
        tally = Tally()
        for sample, actor_logp in zip(batch.samples, found):
            log_ratio = actor_logp.float().cpu() - torch.tensor(sample.old_logprobs)  # log p_actor / p_sampler
            tally.add(sampler_check(log_ratio))
            if rl.tis_cap is not None:
                sample.is_weight = torch.clamp(torch.exp(log_ratio), max=rl.tis_cap).tolist()
            sample.old_logprobs = actor_logp.tolist()
        batch.metrics.update(sampler_gap(tally.over_ranks()))

    def _record(self, tracker: Tracker | None) -> None:
        """The last step's trajectories of every rank saved (rl.save_rollouts) and a few shown in
        TensorBoard (rl.log_samples); older saved steps removed."""
        rl, step = self.rl, self.step
        if not (rl.save_rollouts or rl.log_samples):
            return
        trajectories = distributed.gather(self.trajectories)
        if tracker is not None and rl.log_samples:
            tracker.text("samples", samples_markdown(trajectories, rl.log_samples), step)
        if distributed.is_main() and rl.save_rollouts:
            folder = self.run_dir / "rollouts"
            folder.mkdir(exist_ok=True)
            write_trajectories(folder / f"step_{step:06d}.jsonl.gz", trajectories)
            for old in folder.glob("step_*.jsonl.gz"):
                if int(old.name[5:11]) <= step - rl.save_rollouts:
                    old.unlink()

    def _hook(self, hook: str, batch: StepBatch, timing: dict) -> None:
        for component in self.components:
            with timed(timing, component.name):
                getattr(component, hook)(batch)

    def _update(self, batch: StepBatch, aux_batches: dict) -> tuple[Tally, int, int]:
        """`rl.epochs` passes of mini-batch optimiser steps (the policy loss plus each auxiliary
        loss's share) over the samples in `rl.mini_batch_order`; returns the metrics of every
        optimiser step, their number and the tokens the policy loss's forward passes ran (packed
        rows count a shared prompt once). On a step of rl.check_logprobs_every, the first optimiser
        step's forward passes, which run the weights that sampled, measure the sampler-actor gap."""
        rl, pad, step = self.rl, self.tokenizer.pad_token_id, batch.step
        check = bool(rl.check_logprobs_every) and step % rl.check_logprobs_every == 0 and rl.old_logprobs != "actor"
        groups = [t.group_id for t in batch.trajectories for _ in t.steps] if rl.mini_batch_order == "grouped" else None
        tally, computed = Tally(), 0
        orders = epoch_orders(len(batch.samples), groups, rl.epochs, self.config.seed, step)
        n_chunks = -(-int(distributed.all_sum([len(batch.samples)])[0]) // rl.mini_batch_size)
        for epoch, order in enumerate(orders):
            samples = [batch.samples[i] for i in order]
            for k, chunk in enumerate(mini_batch_split(samples, rl.mini_batch_size, n_chunks, self.world)):
                lengths = [s.n_targets for s in chunk]
                weights = aggregation_weights(lengths, rl.loss_agg, distributed.all_sum([sum(lengths), len(lengths)]))
                for s, w in zip(chunk, weights):
                    s.weight = [w] * s.n_targets
                first = check and epoch == 0 and k == 0
                parts = [(micro_batches(chunk, rl.micro_batch_tokens, pad, self.packing),
                          self.loss.on(self.actor, check=first))] if chunk else []
                computed += sum(b.n_computed for batches, _ in parts for b in batches)
                for aux in self.aux_losses:
                    share = aux_batches[aux.name].samples[k::n_chunks]
                    aux_tokens = distributed.all_sum([sum(s.n_targets for s in share)])[0]
                    if share:
                        parts.append((micro_batches(share, rl.micro_batch_tokens, pad, self.packing),
                                      aux_part(aux, self.actor, aux_tokens)))
                result = self.actor.optimizer_step(parts)
                self._skipped_in_a_row = self._skipped_in_a_row + 1 if result.counts["skipped_updates"] else 0
                if self._skipped_in_a_row >= rl.max_skipped_updates:
                    raise RunError(f"{self._skipped_in_a_row} optimiser updates in a row had a non-finite loss or "
                                   f"gradient norm (grad_norm {result.per_update['grad_norm']}) and were skipped, "
                                   f"up to RL step {step}: lower rl.optim.lr, check a custom loss, or resume from "
                                   f"an earlier checkpoint")
                tally.add(result)
        return tally, max(1, rl.epochs * n_chunks), computed

    def evaluate(self) -> dict:
        """The policy now, on the evaluation splits (written to eval/step_N)."""
        cfg = self.config
        return evaluate(self.pool, self.sampler, self.tokenizer, cfg.eval, cfg.prompt, cfg.seed,
                        self.run_dir / "eval" / f"step_{self.step:06d}", self.components)

    # --- the loop ----------------------------------------------------------------------------------
    def run(self, resume: bool = False, baseline: dict | None = None) -> dict:
        """Train to `rl.steps` (from the last checkpoint when resuming); the final evaluation; the
        last checkpoint exported as a plain HF folder, run_dir/model. `baseline`: evaluation results
        of the model RL starts from (the pipeline's post-SFT or initial evaluation), logged as step 0
        of the eval/* curves when the run starts fresh. Each checkpoint's state holds the seconds the
        run has taken to reach it, over every run that continued it."""
        rl, started, spent = self.rl, time.perf_counter(), 0.0  # spent: by the runs this one continues
        if resume and (ckpt := latest_checkpoint(self.run_dir)) is not None:
            self.actor.load(ckpt)
            self.sampler.update_weights(self.actor.weights())  # a separate sampler copy too
            state = read_state(ckpt)
            self.step, spent = state["step"], state.get("seconds", 0.0)
            for component in self.components:
                component.load(ckpt / component.name)
                component.load_state(state.get("components", {}).get(component.name, {}))
        main = distributed.is_main()  # with several ranks, rank 0 evaluates, logs and reports
        tracker = Tracker(self.run_dir / "logs", self.step, self.config, "rl") if main else None
        if tracker is not None and self.step == 0 and baseline:
            tracker.log(0, eval_metrics(baseline))
        results = {}
        try:
            with progress(disable=not main) as bar:
                task = bar.add_task("RL", total=rl.steps, completed=self.step)
                while self.step < rl.steps:
                    metrics = self.train_step()
                    last = self.step == rl.steps
                    if main and ((rl.eval_every and self.step % rl.eval_every == 0) or last):
                        results = self.evaluate()
                        metrics.update(eval_metrics(results))
                    distributed.barrier()
                    self._record(tracker)
                    if tracker is not None:
                        tracker.log(self.step, metrics)
                    if (rl.save_every and self.step % rl.save_every == 0) or last:
                        state = {"components": {c.name: c.state() for c in self.components if c.state()},
                                 "seconds": spent + time.perf_counter() - started}
                        save_checkpoint(self.run_dir, self.step, self.actor, self.tokenizer, state, rl.keep_last,
                                        {c.name: c for c in self.components}, self.config.prompt)
                    bar.update(task, completed=self.step, description=(
                        f"RL success {metrics['rollout/success']:.2f} len {metrics['rollout/length']:.1f}"))
                    if main and plain_output():
                        print(f"RL step {self.step}/{rl.steps}  success {metrics['rollout/success']:.2f}  reward "
                              f"{metrics['rollout/episode_reward']:.2f}  length {metrics['rollout/length']:.1f}  kl "
                              f"{metrics.get('actor/kl', 0.0):.4f}  entropy {metrics.get('actor/entropy', 0.0):.3f}  "
                              f"{metrics['timing_s/step']:.1f} s", flush=True)
            if main and not results:  # resumed at the last step: the final evaluation again
                results = self.evaluate()
            if main and self.step:  # rl.steps: 0 evaluates the starting model and trains nothing to export
                export_final(self.run_dir, self.model_path, self.config.model.dtype)
        finally:
            if tracker is not None:
                tracker.close()
        return results


def samples_markdown(trajectories: list, n: int) -> str:
    """The last turn of up to `n` episodes, one per task group where there are enough groups."""
    by_group = {}
    for t in trajectories:
        by_group.setdefault(t.group_id, []).append(t)
    picked = [ts[i] for i in range(max(map(len, by_group.values()), default=0)) for ts in by_group.values()
              if i < len(ts)][:n]
    parts = []
    for t in picked:
        if not t.steps:
            continue
        s = t.steps[-1]
        advantage = "-" if s.advantage is None else f"{s.advantage:+.3f}"
        parts.append(f"**{t.task_id}** ({t.task_type}) turn {t.length}: reward {s.reward:g}, episode reward "
                     f"{t.episode_reward:g}, success {t.success}, advantage {advantage}\n\n"
                     f"```\n{s.prompt}\n```\n\n```\n{s.response}\n```")
    return "\n\n---\n\n".join(parts) or "(no episode played)"


def eval_metrics(results: dict) -> dict[str, float]:
    """eval/<split>/<number> and eval/<split>/success/<task type> of an evaluation's results."""
    metrics = {}
    for split, r in results.items():
        metrics.update({f"eval/{split}/{key}": value for key, value in r.items() if isinstance(value, (int, float))})
        metrics.update({f"eval/{split}/success/{kind}": rate for kind, rate in r["per_task_type"].items()})
        metrics[f"eval/{split}/ci95_low"], metrics[f"eval/{split}/ci95_high"] = r["ci95"]
    return metrics


def shuffled(samples: list, groups: list[int] | None, rng: random.Random) -> list:
    """A shuffled copy of `samples`; with `groups` (each sample's task group), the groups in a
    random order, each one's samples kept together in their order."""
    if groups is None:
        out = list(samples)
        rng.shuffle(out)
        return out
    members: dict[int, list] = {}
    for sample, group in zip(samples, groups):
        members.setdefault(group, []).append(sample)
    order = list(members)
    rng.shuffle(order)
    return [s for group in order for s in members[group]]


def epoch_orders(n: int, groups: list[int] | None, epochs: int, seed: int, step: int) -> list[list[int]]:
    """Each epoch's order of training step `step`'s `n` samples (their indices), drawn from (seed,
    step), each shuffled from the last epoch's (`shuffled`); with `groups` (each sample's task
    group) every epoch keeps each group's samples together."""
    rng = random.Random(step_seed(seed, step, "shuffle"))
    order, orders = list(range(n)), []
    for _ in range(epochs):
        order = shuffled(order, [groups[i] for i in order] if groups is not None else None, rng)
        orders.append(order)
    return orders


def mini_batch_split(samples: list, size: int, n_chunks: int, world: int) -> list[list]:
    """This rank's part of each of the step's `n_chunks` mini-batches: slices of `size` in one
    process; with several ranks, each rank's samples in `n_chunks` near-equal contiguous parts."""
    if world == 1:
        return [samples[i:i + size] for i in range(0, len(samples), size)]
    bounds = [round(i * len(samples) / n_chunks) for i in range(n_chunks + 1)]
    return [samples[a:b] for a, b in zip(bounds, bounds[1:])]


def build_components(ctx: Context) -> tuple[list[Component], list]:
    """The run's components, in hook order: those built for every run (the KL reference's), those
    the estimator brings, `rl.components` in their order, then the auxiliary losses (also returned
    apart: their losses join the update)."""
    rl = ctx.config.rl
    components: list[Component] = [part for name in COMPONENTS.always() for part in COMPONENTS.get(name)(None, ctx)]
    extra = ADVANTAGES.entry(rl.advantage.type).components
    if extra is not None:
        components += extra(rl.advantage, ctx)
    components += [COMPONENTS.get(c.type)(c, ctx) for c in rl.components]
    aux_losses = [AUX_LOSSES.get(aux.type)(aux, ctx) for aux in rl.aux]
    names = [c.name for c in components + aux_losses]
    if len(set(names)) < len(names):
        raise ValueError(f"trainer components need distinct names (their metrics and checkpoint folders): {names}")
    return components + aux_losses, aux_losses
