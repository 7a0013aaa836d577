"""The environment protocol: what every text environment gives the rollout loop.

An environment plays one task at a time. `reset(task_id)` starts the task and returns the first
`Observation`; `step(action)` applies one action (or `None` for a response that held no parseable
action: a no-op that still costs a step) and returns a `StepResult`. An environment whose engine
judges moves itself may also define `try_step(action)`: the step if the engine takes the move, else
`Rejected` with nothing changed and no step counted, so that the agent may choose again
(`sampling.retries`; ScienceWorld: a move its parser does not understand).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from agentrl.registry import ENVIRONMENTS


@dataclass
class Observation:
    text: str
    """The raw current observation, as the environment printed it (no history, no template)."""
    task: str
    """The goal, in words ("put a clean apple in diningtable.")."""
    admissible_actions: list[str]
    anchor: str
    """Key for grouping identical states across rollouts of one task (GiGPO / GAGPO)."""
    info: dict = field(default_factory=dict)
    actions_text: str | None = None
    """How a prompt lists the admissible actions, where a flat list would not fit (ScienceWorld);
    None: the comma-joined `admissible_actions`."""
    memory: str | None = None
    """The environment's compact record of the episode so far (where the agent has been, what it
    has seen), for the prompt's {memory} field; None where the environment keeps none."""


@dataclass
class StepResult:
    observation: Observation
    reward: float
    done: bool
    success: bool
    info: dict = field(default_factory=dict)
    """Anything else the environment reports (e.g. whether the action was admissible)."""
    progress: bool | None = None
    """The environment's own verdict on the action (True: it helped, False: it could not help,
    None: no opinion); GCD's `env` label source reads it."""


@dataclass
class Rejected:
    """A move `try_step` did not play: the environment's state and step count are unchanged."""

    feedback: str
    """What the environment answered (e.g. ScienceWorld's "No known action matches that input.")."""


@runtime_checkable
class Environment(Protocol):
    """What the rollout needs of an environment. It may also define `prepare()`: build once, for
    `agentrl prepare`, what it would otherwise build on first use (ALFWorld: its game files)."""

    max_steps: int

    def reset(self, task_id: str) -> Observation: ...

    def step(self, action: str | None) -> StepResult: ...

    def split_tasks(self, split: str) -> list[str]:
        """The fixed, ordered task list of an evaluation split (or the train pool)."""
        ...

    def task_type(self, task_id: str) -> str: ...

    def close(self) -> None: ...


class NoExpertMove(RuntimeError):
    """The expert has no move from the current state (the episode left its plan)."""


class ExpertEnvironment(Environment, Protocol):
    def expert_action(self) -> tuple[str, str]:
        """(thought, action): the expert's next move in the current episode (for SFT data);
        raises `NoExpertMove` when it has none."""
        ...


def sample_tasks(env: Environment, split: str, n: int, rng: random.Random, by_type: bool = False) -> list[str]:
    """n task ids drawn with replacement from a split: every task equally likely, or (by_type) a
    task type uniformly, then one of its tasks."""
    tasks = env.split_tasks(split)
    if not by_type:
        return [tasks[rng.randrange(len(tasks))] for _ in range(n)]
    types: dict[str, list[str]] = {}
    for task in tasks:
        types.setdefault(env.task_type(task), []).append(task)
    groups = list(types.values())
    return [group[rng.randrange(len(group))] for group in (groups[rng.randrange(len(groups))] for _ in range(n))]


def make_env(config) -> Environment:
    """Build the environment a config section names (its `type`), passing the other fields."""
    fields = {name: getattr(config, name) for name in type(config).model_fields if name != "type"}
    return ENVIRONMENTS.get(config.type)(**fields)
