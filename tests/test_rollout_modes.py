"""Lock-step and async rollouts: the same episodes for a sampler whose output depends only on its
prompt, whatever order the environments answer in."""

import time

import pytest
import torch
from conftest import COMPACT

from agentrl.config import EnvPoolConfig, PromptConfig, SamplingConfig
from agentrl.envs.latency import LatencyEnvConfig
from agentrl.envs.pool import EnvPool
from agentrl.models import load_model, load_tokenizer
from agentrl.rollout.collect import collect
from agentrl.sampler.hf import HFSampler

GREEDY = SamplingConfig(temperature=0.0, max_new_tokens=8)
PROMPT = PromptConfig(template=COMPACT, history_length=1, require_think=False)


class OneAtATime:
    """The real HF sampler, greedy, one prompt per call: each output depends on its prompt only."""

    def __init__(self, sampler):
        self.sampler, self.batches = sampler, []

    def generate(self, prompts, params):
        self.batches.append(len(prompts))
        return [self.sampler.generate([p], params)[0] for p in prompts]


class Streaming(OneAtATime):
    """The same, behind the streaming interface (start / advance) that the vLLM engine offers:
    each `advance` finishes the oldest request in flight."""

    def __init__(self, sampler):
        super().__init__(sampler)
        self.queue = []

    def start(self, key, prompt, params):
        self.queue.append((key, prompt, params))

    def advance(self):
        if not self.queue:
            return []
        key, prompt, params = self.queue.pop(0)
        return [(key, self.generate([prompt], params)[0])]


def transcript(trajectories):
    return [(t.task_id, t.group_id, t.success, t.aborted,
             [(s.prompt, s.response_ids, s.logprobs, s.action, s.reward) for s in t.steps]) for t in trajectories]


@pytest.fixture(scope="module")
def sampler(tiny_model_dir):
    return HFSampler(load_model(tiny_model_dir), load_tokenizer(tiny_model_dir)), load_tokenizer(tiny_model_dir)


@pytest.mark.parametrize("wrapper", [OneAtATime, Streaming], ids=["batched", "streaming"])
def test_async_plays_the_same_episodes_as_lockstep(sampler, wrapper):
    hf, tokenizer = sampler
    # Heavy-tailed step latency in 3 worker processes: the environments answer out of order.
    env = LatencyEnvConfig(inner={"type": "household", "max_steps": 4}, step_median_s=0.01, step_sigma=1.5)
    tasks = ["train-3", "train-8"]
    runs = {}
    with EnvPool(env, EnvPoolConfig(workers=3)) as pool:
        for mode in ("lockstep", "async"):
            timing, ended = {}, []
            runs[mode] = (wrapper(hf), timing, ended)
            trajectories = collect(pool, runs[mode][0], tokenizer, tasks, 3, PROMPT, GREEDY, timing=timing,
                                   finished=ended.append, mode=mode, batch_window_s=0.005)
            runs[mode] += (transcript(trajectories),)
    (lock, _, lock_ended, expected), (fast, timing, ended, got) = runs["lockstep"], runs["async"]
    assert got == expected
    assert sum(ended) == sum(lock_ended) == 6
    assert sum(len(steps) for *_, steps in got) == sum(fast.batches) > 6  # every step sampled once
    assert timing["gen"] > 0 and timing["env"] > 0
    if wrapper is OneAtATime:  # lockstep: one batch per turn; async: batches as episodes became ready
        assert len(lock.batches) == 4 and len(fast.batches) > len(lock.batches)


def test_async_samples_at_once_when_no_environment_is_busy(sampler):
    """The batch window gathers ready episodes while environments are still busy; once none is,
    the ready ones are sampled at once: a window longer than the whole rollout costs nothing."""
    hf, tokenizer = sampler
    env = LatencyEnvConfig(inner={"type": "household", "max_steps": 2}, step_median_s=0.001, step_sigma=0.1)
    with EnvPool(env, EnvPoolConfig(workers=2)) as pool:
        start = time.perf_counter()
        trajectories = collect(pool, OneAtATime(hf), tokenizer, ["train-3"], 2, PROMPT, GREEDY, mode="async",
                               batch_window_s=20.0)
        assert time.perf_counter() - start < 20.0
    assert all(t.steps for t in trajectories)

class KillsWorkerZero(OneAtATime):
    """Kills worker 0's process (slot 0's environment) at its `at`-th call."""

    def __init__(self, sampler, pool, at):
        super().__init__(sampler)
        self.pool, self.at = pool, at

    def generate(self, prompts, params):
        if len(self.batches) + 1 == self.at:
            self.pool.transport.procs[0].kill()
        return super().generate(prompts, params)


def test_a_worker_killed_in_async_mode_aborts_its_episode_only(sampler):
    hf, tokenizer = sampler
    env = LatencyEnvConfig(inner={"type": "household", "max_steps": 4}, step_median_s=0.01, step_sigma=1.0)
    with EnvPool(env, EnvPoolConfig(workers=6)) as pool:
        trajectories = collect(pool, KillsWorkerZero(hf, pool, at=3), tokenizer, ["train-3", "train-8"], 3, PROMPT,
                               GREEDY, mode="async", batch_window_s=0.0)
        assert len(pool.faults) == 1
    assert [t.aborted for t in trajectories] == [True] + [False] * 5
    assert all(len(t.steps) == 4 or t.success for t in trajectories[1:])


@pytest.mark.parametrize("mode", ["lockstep", "async"])
def test_an_episode_aborted_at_reset_is_reported_finished(sampler, mode):
    """The progress count covers every episode, one whose environment died before its first move
    included."""
    hf, tokenizer = sampler
    env = LatencyEnvConfig(inner={"type": "household", "max_steps": 2}, step_median_s=0.001, step_sigma=0.1)
    ended = []
    with EnvPool(env, EnvPoolConfig(workers=3)) as pool:
        pool.transport.procs[0].kill()
        trajectories = collect(pool, OneAtATime(hf), tokenizer, ["train-3"], 3, PROMPT, GREEDY,
                               finished=ended.append, mode=mode, batch_window_s=0.0)
    assert [(t.aborted, len(t.steps) > 0) for t in trajectories] == [(True, False), (False, True), (False, True)]
    assert sum(ended) == 3


def hall_episode():
    from agentrl.envs.base import Observation
    from agentrl.rollout.collect import Episode
    from agentrl.rollout.types import Trajectory

    return Episode(slot=0, trajectory=Trajectory(task_id="train-0", group_id=0, task_type="two_step"),
                   observation=Observation("You are in the hall.", "reach the garden", ["go north"], "room:hall"))


def test_a_step_records_an_action_only_with_the_reasoning_the_prompt_requires(sampler):
    """`prompt.require_think`: a reply naming an admissible action without a reasoning block is
    recorded as no action, with the invalid-action penalty, as the retries judge it; without the
    requirement it is the action."""
    from agentrl.rollout.collect import EpisodeRules
    from agentrl.sampler.base import Generation

    _, tokenizer = sampler
    bare = tokenizer("<action>go north</action>", add_special_tokens=False).input_ids
    for require_think, action in ((True, None), (False, "go north")):
        prompt = PromptConfig(template=COMPACT, history_length=1, require_think=require_think)
        rules, e, gen = EpisodeRules(tokenizer, prompt, "", max_steps=4), hall_episode(), Generation(bare, [-1.0] * len(bare))
        rules.ask(e)
        assert rules.playable(e, gen) == (action is not None)
        assert rules.act(e, gen) == action == e.trajectory.steps[-1].action
        assert e.trajectory.steps[-1].penalty == (prompt.invalid_penalty if action is None else 0.0)


def test_only_a_full_history_episode_is_ended_by_the_context(sampler):
    """A window's prompt does not grow with the episode: the context never ends a window's episode
    (a prompt past it is the sampler's error, said), while a full-history episode whose next
    prompt and reply would pass it ends there, marked."""
    from agentrl.rollout.collect import EpisodeRules

    _, tokenizer = sampler
    for prompt, ended in ((PromptConfig(template=COMPACT, history_length=1), False),
                          (PromptConfig(full_history=True, history_length=0), True)):
        rules, e = EpisodeRules(tokenizer, prompt, "", max_steps=4, context=8, reply_tokens=4), hall_episode()
        assert len(rules.ask(e)) > 8
        assert rules.fits(e) is not ended and e.trajectory.context_ended is ended


def test_each_retry_resamples_its_own_episodes_prompt(choice_model_dir):
    """Episodes in different states: every resample is asked with the prompt of the episode whose
    answer it replaces, and only those whose current answer names no admissible action."""
    import twostep

    from agentrl.envs.base import Observation
    from agentrl.rollout.collect import Episode, EpisodeRules
    from agentrl.rollout.types import Trajectory

    class Recording(OneAtATime):
        def generate(self, prompts, params):
            out = super().generate(prompts, params)
            self.asked.append((list(prompts), out))
            return out

    tokenizer = load_tokenizer(choice_model_dir)
    sampler = Recording(HFSampler(load_model(choice_model_dir), tokenizer))
    sampler.asked = []
    rules = EpisodeRules(tokenizer, PromptConfig(template=twostep.TEMPLATE, history_length=1), "", max_steps=2)
    episodes = [Episode(slot=i, trajectory=Trajectory(task_id="train-0", group_id=0, task_type="two_step"),
                        observation=Observation(f"You are in hall {i}.", "reach the garden (train-0)", [twostep.GOOD],
                                                "room:hall", actions_text=f"{twostep.GOOD}, {twostep.BAD}"))
                for i in range(12)]
    prompts = [rules.ask(e) for e in episodes]
    assert len({tuple(p) for p in prompts}) == 12
    torch.manual_seed(0)
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=24, retries=8)
    rules.retry(sampler, episodes, sampler.generate(prompts, sampling), sampling)
    current = list(sampler.asked[0][1])
    assert len(sampler.asked) > 1  # some first answer named BAD
    for asked, answers in sampler.asked[1:]:
        again = [i for i, (e, gen) in enumerate(zip(episodes, current)) if not rules.playable(e, gen)]
        assert asked == [prompts[i] for i in again]
        for i, gen in zip(again, answers):
            current[i] = gen


def test_retries_resample_until_the_action_is_admissible(choice_model_dir):
    """The choice model names GOOD or BAD about half the time each; where only GOOD is admissible
    (the prompt still lists both), retries resample just the steps that named BAD, and stop at
    the first admissible answer."""
    import twostep

    from agentrl.envs.base import Observation
    from agentrl.rollout.collect import Episode, EpisodeRules
    from agentrl.rollout.types import Trajectory

    hf, tokenizer = HFSampler(load_model(choice_model_dir), load_tokenizer(choice_model_dir)), \
        load_tokenizer(choice_model_dir)
    prompt = PromptConfig(template=twostep.TEMPLATE, history_length=1)
    rules = EpisodeRules(tokenizer, prompt, "", max_steps=2)
    only_good = Observation("You are in the hall.", "reach the garden (train-0)", [twostep.GOOD], "room:hall",
                            actions_text=f"{twostep.GOOD}, {twostep.BAD}")
    episodes = [Episode(slot=i, trajectory=Trajectory(task_id="train-0", group_id=0, task_type="two_step"), observation=only_good)
                for i in range(16)]
    for e in episodes:
        rules.ask(e)
    torch.manual_seed(0)

    def named(retries):
        counting = OneAtATime(hf)
        sampling = SamplingConfig(temperature=1.0, max_new_tokens=24, retries=retries)
        first = counting.generate([e.prompt_ids for e in episodes], sampling)
        played = rules.retry(counting, episodes, first, sampling)
        return [rules.act(e, gen) for e, gen in zip(episodes, played)], counting.batches

    actions, batches = named(0)
    assert 3 <= actions.count(twostep.BAD) <= 13 and batches == [16]
    actions, batches = named(12)
    assert actions == [twostep.GOOD] * 16
    assert batches[0] == 16 and 0 < batches[1] < 16 and batches == sorted(batches, reverse=True)


def test_a_state_without_an_admissible_list_plays_its_first_answer(choice_model_dir):
    """Retries resample answers that name no admissible action; a state whose environment lists
    none (free-text actions) has nothing to check against, so its first answer is played."""
    import twostep

    from agentrl.envs.base import Observation
    from agentrl.rollout.collect import Episode, EpisodeRules
    from agentrl.rollout.types import Trajectory

    tokenizer = load_tokenizer(choice_model_dir)
    counting = OneAtATime(HFSampler(load_model(choice_model_dir), tokenizer))
    rules = EpisodeRules(tokenizer, PromptConfig(template=twostep.TEMPLATE, history_length=1), "", max_steps=2)
    free = Observation("You are in the hall.", "reach the garden (train-0)", [], "room:hall",
                       actions_text=f"{twostep.GOOD}, {twostep.BAD}")
    episodes = [Episode(slot=i, trajectory=Trajectory(task_id="train-0", group_id=0, task_type="two_step"),
                        observation=free) for i in range(8)]
    torch.manual_seed(0)
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=24, retries=4)
    first = counting.generate([rules.ask(e) for e in episodes], sampling)
    assert rules.retry(counting, episodes, first, sampling) == first
    assert counting.batches == [8]
