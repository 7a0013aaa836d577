"""DAgger (Ross et al. 2011): the policy plays, the expert labels every state it reaches.

Behaviour cloning trains on the states the expert visits; the policy, once it errs, lands in
states the data never showed. Each DAgger round lets the current policy play train episodes, asks
the environment's expert for its move in every state reached (whoever acted), adds those labelled
states to the data and trains on the aggregate. At each step the expert's move is executed instead
of the policy's with the round's `expert_share`, annealed over the rounds (the ALFWorld paper's
BUTLER: from 100% to 1%), so the early rounds stay near the expert's states and the late ones see
the policy's own.

The labels come from the pool's `expert` command: the environment answers in its own process,
from its own state, so any environment whose expert can move from any state (ALFWorld's observer,
the household and testbed experts) works; a state where the expert has no move gets no example.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

from agentrl.envs.base import sample_tasks
from agentrl.files import write_atomic
from agentrl.prompting import format_response
from agentrl.rollout.collect import Episode, EpisodeRules
from agentrl.rollout.types import Trajectory


def expert_share(dagger, round_number: int) -> float:
    """The share of executed moves that are the expert's in round `round_number` (1-based): the
    first and last of `dagger.expert_share`, linear in between."""
    first, last = dagger.expert_share
    if dagger.rounds == 1:
        return first
    return first + (last - first) * (round_number - 1) / (dagger.rounds - 1)


@dataclass
class Labelled:
    """One round's play: the chat examples of every labelled state, and the episodes as played
    (each step's `action` the move executed: the policy's, or the expert's in its stead)."""

    examples: list[dict]
    trajectories: list[Trajectory]
    agreed: int
    """Labelled states where the policy's own action was the expert's."""

    def stats(self) -> RoundStats:
        played = [t for t in self.trajectories if not t.aborted]
        return RoundStats(episodes=len(played), examples=len(self.examples),
                          success=sum(t.success for t in played) / max(len(played), 1),
                          policy_agreement=self.agreed / max(len(self.examples), 1))


@dataclass
class RoundStats:
    episodes: int
    examples: int
    """Labelled states (the new SFT examples)."""
    success: float
    """Episodes won, expert moves included."""
    policy_agreement: float
    """Share of labelled states where the policy's own action was the expert's."""


def play_labelled(pool, sampler, tokenizer, tasks: list[str], prompt, sampling, share: float,
                  rng: random.Random) -> Labelled:
    """Play one episode of each task in lock-step, every state labelled by the expert."""
    episodes = [Episode(slot=i, trajectory=Trajectory(task_id=t, group_id=i, task_type=pool.local.task_type(t)))
                for i, t in enumerate(tasks)]
    rules = EpisodeRules(tokenizer, prompt, "", pool.max_steps, context=getattr(sampler, "context_length", None),
                         reply_tokens=sampling.max_new_tokens)
    observations = pool.reset({e.slot: e.trajectory.task_id for e in episodes})
    active = [e for e in episodes if rules.started(e, observations[e.slot])]
    examples, agreed = [], 0
    while active:
        labels = pool.expert([e.slot for e in active])
        generations = sampler.generate([rules.ask(e) for e in active], sampling)
        actions = {}
        for e, generation in zip(active, generations):
            context = rules.conversation(e)
            action = rules.act(e, generation)
            label = labels[e.slot]
            if label is not None:
                thought, expert_action = label
                response = format_response(thought, expert_action)
                examples.append({"task_id": e.trajectory.task_id,
                                 "messages": context + [{"role": "assistant", "content": response}]})
                agreed += action == expert_action
                if rng.random() < share:  # the expert's move is played (and, in a full history, shown)
                    step, action = e.trajectory.steps[-1], expert_action
                    step.action, step.response = expert_action, response
                    step.response_ids = tokenizer(response, add_special_tokens=False).input_ids + [tokenizer.eos_token_id]
            actions[e.slot] = action
        results = pool.step(actions)
        active = [e for e in active if rules.stepped(e, results[e.slot])]
    return Labelled(examples, [e.trajectory for e in episodes], agreed)


def dagger_data(pool, sampler, tokenizer, config, round_number: int, out: Path) -> RoundStats:
    """Round `round_number`'s labelled examples (`sft.dagger.episodes` train tasks, drawn with the
    run's seed and the round) written to `out` as a JSONL chat dataset."""
    dagger = config.sft.dagger
    rng = random.Random(config.seed * 1000 + round_number)  # the pipeline seeds torch's sampling alike
    tasks = sample_tasks(pool.local, "train", dagger.episodes, rng)
    played = play_labelled(pool, sampler, tokenizer, tasks, config.prompt, dagger.sampling,
                           expert_share(dagger, round_number), rng)
    write_atomic(out, "".join(json.dumps(example) + "\n" for example in played.examples))
    return played.stats()
