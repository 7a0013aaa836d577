"""The rollout loop: K episodes per task, all active episodes sampled in one batch per step.

Finished episodes stop generating; the loop ends when every episode is done. An episode whose
environment worker failed is marked aborted and stops there.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

from agentrl.prompting import HistoryEntry, parse_action, render_prompt
from agentrl.rollout.types import StepSample, Trajectory


@dataclass
class _Episode:
    slot: int
    trajectory: Trajectory
    observation: object
    history: list[HistoryEntry] = field(default_factory=list)


def encode_prompt(tokenizer, text: str) -> list[int]:
    chat = tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                         add_generation_prompt=True)
    return tokenizer(chat, add_special_tokens=False).input_ids


def collect(pool, sampler, tokenizer, tasks: list[str], group_size: int, prompt, sampling,
            first_group_id: int = 0, timing: dict | None = None, hint: str = "",
            finished: Callable[[int], None] | None = None) -> list[Trajectory]:
    """Play `group_size` episodes of each task; returns trajectories in (task, rollout) order.

    `hint` is appended to the task text of every prompt (prompt-based correction uses it);
    `finished(n)` is told after every turn how many episodes ended in it (a progress bar).
    """
    timing = timing if timing is not None else {}
    episodes = []
    for t, task_id in enumerate(tasks):
        for _ in range(group_size):
            traj = Trajectory(task_id=task_id, group_id=first_group_id + t,
                              task_type=pool.local.task_type(task_id))
            episodes.append(_Episode(slot=len(episodes), trajectory=traj, observation=None))
    start = time.perf_counter()
    observations = pool.reset({e.slot: e.trajectory.task_id for e in episodes})
    timing["env"] = timing.get("env", 0.0) + time.perf_counter() - start
    for e in episodes:
        e.observation = observations[e.slot]
        e.trajectory.aborted = e.observation is None

    active = [e for e in episodes if not e.trajectory.aborted]
    for step in range(pool.max_steps):
        if not active:
            break
        texts = [render_prompt(prompt.template, e.observation, e.history, step, prompt.history_length)
                 for e in active]
        if hint:
            texts = [f"{hint}\n{text}" for text in texts]
        prompt_ids = [encode_prompt(tokenizer, text) for text in texts]
        start = time.perf_counter()
        generations = sampler.generate(prompt_ids, sampling)
        timing["gen"] = timing.get("gen", 0.0) + time.perf_counter() - start

        actions = {}
        for e, text, ids, gen in zip(active, texts, prompt_ids, generations):
            response = tokenizer.decode(gen.token_ids, skip_special_tokens=True)
            action = parse_action(response, prompt.require_think)
            actions[e.slot] = action
            e.trajectory.steps.append(StepSample(
                prompt_ids=ids, response_ids=gen.token_ids, logprobs=gen.logprobs, response=response,
                action=action, observation=e.observation.text, anchor=e.observation.anchor,
                penalty=0.0 if action is not None else prompt.invalid_penalty, prompt=text))
        start = time.perf_counter()
        results = pool.step(actions)
        timing["env"] += time.perf_counter() - start

        still = []
        for e in active:
            result = results[e.slot]
            if result is None:
                e.trajectory.aborted = True
                continue
            sample = e.trajectory.steps[-1]
            sample.reward = result.reward
            sample.progress = result.progress
            e.history.append(HistoryEntry(e.observation.text, sample.action or "(no valid action)"))
            e.observation = result.observation
            if result.done:
                e.trajectory.success = result.success
            else:
                still.append(e)
        if finished is not None:
            finished(len(active) - len(still))
        active = still
    if finished is not None:
        finished(len(active) + sum(e.trajectory.aborted for e in episodes if not e.trajectory.steps))  # step limit, reset
    return [e.trajectory for e in episodes]
