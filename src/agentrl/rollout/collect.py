"""The rollout loop: K episodes per task, in lock-step or asynchronously.

- lockstep: every turn samples all active episodes in one batch, then steps all their
  environments, and waits for the slowest before the next turn.
- async: each episode moves on as soon as its own environment answers. A streaming sampler
  (one with `start` / `advance`, the vLLM engine) takes each ready episode's request at once and
  returns generations as they finish (continuous batching); any other sampler gets the ready
  episodes in one batch, gathered for up to `batch_window_s` after the first is ready (or until
  no environment is still busy). A slow environment holds back only its own episode.

Both loops play each episode by the same rules (the same prompts from the same history, the
same step limit): with a sampler whose output depends only on its prompt, they return the same
trajectories. An episode whose environment worker failed is marked aborted and stops there.
Timing: `gen` is the time spent in the sampler, `env` the time spent waiting for environments.
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from agentrl import distributed
from agentrl.envs.base import Rejected, sample_tasks
from agentrl.errors import RunError
from agentrl.prompting import ChatTurns, HistoryEntry, encode_prompt, parse_action, render_prompt
from agentrl.rollout.types import StepSample, Trajectory, differing_groups, group_by_id
from agentrl.seeding import step_seed


@dataclass
class Episode:
    slot: int
    trajectory: Trajectory
    observation: object = None
    history: list[HistoryEntry] = field(default_factory=list)
    prompt_text: str = ""
    prompt_ids: list[int] = field(default_factory=list)
    rejected: int = 0
    """Moves the environment rejected in the current state (its `try_step`)."""
    asked: bool = False
    """Whether `prompt_text` and `prompt_ids` are the current state's prompt (built once a state)."""


class EpisodeRules:
    """How one episode advances: its next prompt, its action from a generation, an env answer."""

    def __init__(self, tokenizer, prompt, hint: str, max_steps: int, retries: int = 0,
                 context: int | None = None, reply_tokens: int = 0):
        """`context`: the sampler's (None: unbounded); with full history an episode whose next
        prompt and a reply of `reply_tokens` would pass it ends there."""
        self.tokenizer, self.prompt, self.hint, self.max_steps = tokenizer, prompt, hint, max_steps
        self.retries, self.context, self.reply_tokens = retries, context, reply_tokens
        self.turns = ChatTurns(tokenizer) if prompt.full_history else None

    def ask(self, e: Episode) -> list[int]:
        """Render the episode's next prompt (kept on the episode); its token ids. With
        `prompt.full_history` after the first step: the text of the new user turn, appended to
        the last step's prompt and sampled response. Built once a state: a move the environment
        rejected is chosen again from the same prompt."""
        if e.asked:
            return e.prompt_ids
        steps = e.trajectory.steps
        if self.turns is not None and steps:
            e.prompt_text = render_prompt(self.prompt.turn_template, e.observation, [], len(steps), 0)
            e.prompt_ids = self.turns.next(steps[-1].prompt_ids, steps[-1].response_ids, e.prompt_text)
        else:
            text = render_prompt(self.prompt.template, e.observation, e.history, len(steps), self.prompt.history_length)
            e.prompt_text = f"{self.hint}\n{text}" if self.hint else text
            e.prompt_ids = encode_prompt(self.tokenizer, e.prompt_text)
        e.asked = True
        return e.prompt_ids

    def conversation(self, e: Episode) -> list[dict]:
        """The chat messages of the episode's current prompt (after `ask`): its text alone, or
        with `prompt.full_history` every earlier turn (the responses as decoded)."""
        earlier = e.trajectory.steps if self.turns is not None else []
        messages = [m for s in earlier for m in ({"role": "user", "content": s.prompt},
                                                   {"role": "assistant", "content": s.response})]
        return messages + [{"role": "user", "content": e.prompt_text}]

    def playable(self, e: Episode, gen) -> bool:
        """Whether the generation names an admissible action (any action, where none are listed)."""
        if not e.observation.admissible_actions:
            return True
        response = self.tokenizer.decode(gen.token_ids, skip_special_tokens=True)
        return parse_action(response, self.prompt.require_think) in e.observation.admissible_actions

    def retry(self, sampler, episodes: list[Episode], generations: list, sampling) -> list:
        """The generations, each resampled for its episode's prompt up to `sampling.retries`
        times while it names no admissible action."""
        generations = list(generations)
        for _ in range(sampling.retries):
            again = [i for i, (e, gen) in enumerate(zip(episodes, generations)) if not self.playable(e, gen)]
            if not again:
                break
            for i, gen in zip(again, sampler.generate([episodes[i].prompt_ids for i in again], sampling)):
                generations[i] = gen
        return generations

    def tentative(self, e: Episode) -> bool:
        """Whether the episode's move is tried (the environment may reject it and the episode
        choose again) rather than played: while `sampling.retries` allow."""
        return e.rejected < self.retries

    def act(self, e: Episode, gen) -> str | None:
        """Record the generation as the episode's next step; the action it names (None: none)."""
        response = self.tokenizer.decode(gen.token_ids, skip_special_tokens=True)
        action = parse_action(response, self.prompt.require_think)
        e.trajectory.steps.append(StepSample(
            prompt_ids=e.prompt_ids, response_ids=gen.token_ids, logprobs=gen.logprobs, response=response,
            action=action, observation=e.observation.text, anchor=e.observation.anchor,
            penalty=0.0 if action is not None else self.prompt.invalid_penalty, prompt=e.prompt_text,
            rejected=e.rejected))
        return action

    def started(self, e: Episode, observation) -> bool:
        """Apply a reset's answer; whether the episode goes on."""
        e.observation, e.asked = observation, False
        e.trajectory.aborted = observation is None
        return not e.trajectory.aborted

    def stepped(self, e: Episode, result) -> bool:
        """Apply a step's answer (None: the worker failed; `Rejected`: the move was not played and
        the episode chooses again in the same state); whether the episode goes on."""
        if result is None:
            e.trajectory.aborted = True
            return False
        if isinstance(result, Rejected):
            e.trajectory.steps.pop()
            e.rejected += 1
            return True
        e.rejected = 0
        sample = e.trajectory.steps[-1]
        sample.reward, sample.progress = result.reward, result.progress
        e.history.append(HistoryEntry(e.observation.text, sample.action or "(no valid action)"))
        e.observation, e.asked = result.observation, False
        if result.done:
            e.trajectory.success = result.success
            return False
        return len(e.trajectory.steps) < self.max_steps and self.fits(e)

    def fits(self, e: Episode) -> bool:
        """Whether the episode's next prompt (full history: it grows every turn) leaves room for a
        reply in the context; if not, the episode is marked as ended by it."""
        if self.turns is None or self.context is None:
            return True
        e.trajectory.context_ended = len(self.ask(e)) + self.reply_tokens > self.context
        return not e.trajectory.context_ended


def collect(pool, sampler, tokenizer, tasks: list[str], group_size: int, prompt, sampling,
            first_group_id: int = 0, timing: dict | None = None, hint: str = "",
            finished: Callable[[int], None] | None = None, mode: str = "lockstep",
            batch_window_s: float = 0.05) -> list[Trajectory]:
    """Play `group_size` episodes of each task; returns trajectories in (task, rollout) order.

    `hint` is appended to the task text of every prompt (prompt-based correction uses it);
    `finished(n)` is told as episodes end how many did (a progress bar); `mode`: lockstep or
    async (module docstring).
    """
    timing = timing if timing is not None else {}
    timing.setdefault("gen", 0.0)
    timing.setdefault("env", 0.0)
    episodes = []
    for t, task_id in enumerate(tasks):
        for _ in range(group_size):
            traj = Trajectory(task_id=task_id, group_id=first_group_id + t,
                              task_type=pool.local.task_type(task_id))
            episodes.append(Episode(slot=len(episodes), trajectory=traj))
    rules = EpisodeRules(tokenizer, prompt, hint, pool.max_steps, sampling.retries,
                         getattr(sampler, "context_length", None), sampling.max_new_tokens)
    play = _lockstep if mode == "lockstep" else _async
    play(pool, sampler, rules, episodes, sampling, timing, finished or (lambda n: None), batch_window_s)
    return [e.trajectory for e in episodes]


def _lockstep(pool, sampler, rules, episodes, sampling, timing, finished, batch_window_s) -> None:
    start = time.perf_counter()
    observations = pool.reset({e.slot: e.trajectory.task_id for e in episodes})
    timing["env"] += time.perf_counter() - start
    active = [e for e in episodes if rules.started(e, observations[e.slot])]
    finished(len(episodes) - len(active))
    while active:
        prompt_ids = [rules.ask(e) for e in active]
        start = time.perf_counter()
        generations = rules.retry(sampler, active, sampler.generate(prompt_ids, sampling), sampling)
        timing["gen"] += time.perf_counter() - start
        actions = {e.slot: rules.act(e, gen) for e, gen in zip(active, generations)}
        start = time.perf_counter()
        results = pool.step(actions, frozenset(e.slot for e in active if rules.tentative(e)))
        timing["env"] += time.perf_counter() - start
        still = [e for e in active if rules.stepped(e, results[e.slot])]
        finished(len(active) - len(still))
        active = still


def _async(pool, sampler, rules, episodes, sampling, timing, finished, batch_window_s) -> None:
    by_slot = {e.slot: e for e in episodes}
    streaming = hasattr(sampler, "start") and hasattr(sampler, "advance")
    pool.submit("reset", {e.slot: e.trajectory.task_id for e in episodes})
    in_env = set(by_slot)  # waiting for their environment
    ready: list[Episode] = []  # waiting for the sampler (not yet handed to a streaming one)
    generating = 0  # handed to a streaming sampler, not yet back
    first_ready = 0.0
    while in_env or ready or generating:
        if in_env:
            if streaming:
                timeout = 0.0 if ready or generating else None
            else:
                timeout = None if not ready else max(0.0, first_ready + batch_window_s - time.perf_counter())
            start = time.perf_counter()
            answers = pool.receive(timeout)
            timing["env"] += time.perf_counter() - start
            for slot, answer in answers.items():
                e = by_slot[slot]
                in_env.discard(slot)
                goes_on = rules.stepped(e, answer) if e.trajectory.steps else rules.started(e, answer)
                if not goes_on:
                    finished(1)
                    continue
                if not ready:
                    first_ready = time.perf_counter()
                ready.append(e)
        if not ready and not generating:
            continue
        if not streaming and in_env and time.perf_counter() < first_ready + batch_window_s:
            continue  # gather more ready episodes for the batch
        start = time.perf_counter()
        if streaming:
            for e in ready:
                sampler.start(e.slot, rules.ask(e), sampling)
            generating += len(ready)
            done = sampler.advance()
            generating -= len(done)
            answered = [by_slot[slot] for slot, _ in done]
            outputs = list(zip(answered, rules.retry(sampler, answered, [gen for _, gen in done], sampling)))
        else:
            generations = sampler.generate([rules.ask(e) for e in ready], sampling)
            outputs = list(zip(ready, rules.retry(sampler, ready, generations, sampling)))
        ready = []
        timing["gen"] += time.perf_counter() - start
        for command, moves in (("try", [o for o in outputs if rules.tentative(o[0])]),
                               ("step", [o for o in outputs if not rules.tentative(o[0])])):
            if moves:
                pool.submit(command, {e.slot: rules.act(e, gen) for e, gen in moves})
                in_env.update(e.slot for e, _ in moves)


def draw_tasks(env, config, step: int, draw: int, rank: int, n: int) -> list[str]:
    """`n` train tasks of round `draw` of training step `step`, by type with rl.balance_task_types:
    round 0 is the step's own list, the same on every rank (each plays its share); a later round
    (rl.rollout.filter_groups) is rank `rank`'s own."""
    key = "tasks" if draw == 0 else f"tasks:{draw}:{rank}"
    return sample_tasks(env, "train", n, random.Random(step_seed(config.seed, step, key)), config.rl.balance_task_types)


def play_step(pool, sampler, tokenizer, config, step: int, hint: str, rank: int = 0,
              world: int = 1, timing: dict | None = None) -> tuple[list, int]:
    """Rank `rank`'s trajectories of training step `step` (1-based) and the rounds of tasks drawn:
    every rank draws the same task list and plays its own contiguous share of it. With
    rl.rollout.filter_groups, further rounds of tasks (each rank its own) until its share of
    groups differ in return."""
    rl = config.rl
    share, filtering = rl.tasks_per_step // world, rl.rollout.filter_groups
    tasks = draw_tasks(pool.local, config, step, 0, rank, rl.tasks_per_step)[rank * share:(rank + 1) * share]
    torch.manual_seed(step_seed(config.seed, step, "sampling" if world == 1 else f"sampling:{rank}"))
    rounds = filtering.max_draws if filtering else 1
    trajectories, draws = [], 0
    for draw in range(rounds):
        first_group_id = ((step - 1) * rounds + draw) * rl.tasks_per_step + rank * share  # unique in the run
        trajectories += collect(pool, sampler, tokenizer, tasks, rl.group_size, config.prompt, config.sampling,
                                first_group_id=first_group_id, timing=timing, hint=hint, mode=rl.rollout.mode,
                                batch_window_s=rl.rollout.batch_window_s)
        draws = draw + 1
        if filtering is None:
            break
        differing = len(differing_groups(trajectories))
        if differing >= share:
            break
        rate = differing / len(group_by_id(trajectories))  # tasks drawn for the groups missing, at the rate so far
        n = min(share, math.ceil((share - differing) / max(rate, 1 / share)))
        tasks = draw_tasks(pool.local, config, step, draw + 1, rank, n)
    aborted, total = distributed.all_sum([sum(t.aborted for t in trajectories), len(trajectories)])
    if total and aborted / total > rl.max_aborted_share:
        raise RunError(f"{aborted:.0f} of {total:.0f} episodes aborted in RL step {step} (more than "
                       f"rl.max_aborted_share = {rl.max_aborted_share:g}): {pool.fault_summary()}")
    return trajectories, draws
