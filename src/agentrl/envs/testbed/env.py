"""The credit-assignment testbed: a corridor of rooms whose knobs are what GiGPO, GAGPO and GCD
claim to help with.

A task is a corridor of `horizon` rooms. In each room one of `doors` coloured doors leads on; the
others lead to a dead end (`go back` returns, to exactly the same state: a revisited state). A
room names its way on ("A draft comes through the red door.") with probability `hint_rate`;
without the hint the way on must be found by trying. `distractors` actions per room (`examine X`)
change nothing but cost a step. `delay` rooms before the last, `key_choices` keys lie on the floor:
the one matching the chest named in the task must be taken (the decisive action; a wrong key is
irreversible and fails the task when the chest is tried), and the reward (10) comes only when
the chest opens in the last room, `delay` rooms later. Episodes end at the chest or after
`horizon + slack + 1` steps (the shortest solution takes `horizon + 1`, with the key).

Splits are unseen compositions: train and L0 draw chest colours from the first six colours; L1
asks for the two held-out chest colours (seen on doors, never as the goal); L2 adds both: held-out
chest colours in corridors `l2_extra_rooms` longer than trained. Every world derives from string
seeds, so a task id means the same corridor on every machine.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

from pydantic import Field

from agentrl.config import Section
from agentrl.envs.base import NoExpertMove, Observation, StepResult
from agentrl.registry import ENVIRONMENTS

COLOURS = ["red", "blue", "green", "yellow", "white", "black", "orange", "purple"]
SEEN_GOALS, HELD_OUT_GOALS = COLOURS[:6], COLOURS[6:]
OBJECTS = ["painting", "rug", "lamp", "vase", "clock", "chair", "mirror", "plant"]
SPLITS = ("train", "l0", "l1", "l2")
SUCCESS_REWARD = 10.0


class TestbedConfig(Section):
    """The credit-assignment testbed (see `agentrl.envs.testbed`)."""

    type: Literal["testbed"] = "testbed"
    """Environment name in the registry."""
    horizon: int = Field(4, ge=1, le=20)
    """Rooms in a corridor: the shortest solution takes horizon + 1 steps."""
    doors: int = Field(2, ge=1, le=len(COLOURS))
    """Doors per room, one of which leads on (the others to a dead end)."""
    hint_rate: float = Field(1.0, ge=0, le=1)
    """Share of rooms that say which door leads on (the rest must be found by trying)."""
    distractors: int = Field(1, ge=0, le=len(OBJECTS))
    """`examine` actions per room that change nothing (revisited states)."""
    key_choices: int = Field(2, ge=0, le=len(COLOURS))
    """Keys in the key room (0: no key, the chest is open)."""
    delay: int = Field(2, ge=0)
    """Rooms between the key room and the chest room: how long the decisive action waits for its reward."""
    slack: int = Field(4, ge=0)
    """Steps allowed beyond the shortest solution."""
    expert_key_noise: float = Field(0.0, ge=0, le=1)
    """Share of tasks whose demonstration takes a key at random instead of the chest's (1: a
    demonstrator that never knows which key fits). A cold start imitating it, its failures kept
    with `sft.keep_failed`, picks wrong keys as often, and matching the chest is left to RL."""
    l2_extra_rooms: int = Field(2, ge=0)
    """L2's corridors are this much longer than the others."""
    train_size: int = Field(5000, ge=1)
    """Distinct training tasks."""
    eval_size: int = Field(100, ge=1)
    """Tasks in each of L0, L1, L2."""


@dataclass(frozen=True)
class Corridor:
    goal: str
    """The chest's colour (the key to take)."""
    rooms: tuple[tuple[tuple[str, ...], str, bool, tuple[str, ...]], ...]
    """Per room: (door colours in listing order, the door that leads on, hinted, objects to examine)."""
    key_room: int | None
    keys: tuple[str, ...]


def make_corridor(config: TestbedConfig, task_id: str) -> Corridor:
    return _corridor(task_id, *(getattr(config, k) for k in ("horizon", "doors", "hint_rate", "distractors",
                                                              "key_choices", "delay", "l2_extra_rooms")))


@lru_cache(maxsize=65536)
def _corridor(task_id: str, horizon: int, doors: int, hint_rate: float, distractors: int, key_choices: int,
              delay: int, l2_extra_rooms: int) -> Corridor:
    split, _, index = task_id.rpartition("-")
    if split not in SPLITS or not index.isdigit():
        raise ValueError(f"bad testbed task id {task_id!r}: expected '<split>-<index>' with split in {SPLITS}")
    rng = random.Random(f"testbed:{task_id}")
    goal = rng.choice(HELD_OUT_GOALS if split in ("l1", "l2") else SEEN_GOALS)
    horizon += l2_extra_rooms if split == "l2" else 0
    rooms = []
    for _ in range(horizon):
        colours = tuple(rng.sample(COLOURS, doors))
        rooms.append((colours, rng.choice(colours), rng.random() < hint_rate,
                      tuple(sorted(rng.sample(OBJECTS, distractors)))))
    key_room = max(0, horizon - 1 - delay) if key_choices else None
    keys = tuple(sorted({goal, *rng.sample([c for c in COLOURS if c != goal], key_choices - 1)})) if key_choices else ()
    return Corridor(goal, tuple(rooms), key_room, keys)


@ENVIRONMENTS.register("testbed", TestbedConfig)
class TestbedEnv:
    def __init__(self, **fields):
        self.config = TestbedConfig(**fields)
        self.max_steps = self.config.horizon + self.config.l2_extra_rooms + self.config.slack + 1
        self.corridor: Corridor | None = None

    def split_tasks(self, split: str) -> list[str]:
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}; testbed splits are {SPLITS}")
        size = self.config.train_size if split == "train" else self.config.eval_size
        return [f"{split}-{i}" for i in range(size)]

    def task_type(self, task_id: str) -> str:
        return f"corridor_{len(make_corridor(self.config, task_id).rooms)}"

    def reset(self, task_id: str) -> Observation:
        self.corridor = make_corridor(self.config, task_id)
        self.room, self.dead_end, self.key, self.steps = 0, False, None, 0
        keys = self.corridor.keys
        noisy = keys and random.Random(f"testbed-expert-noise:{task_id}").random() < self.config.expert_key_noise
        self.demonstrated_key = random.Random(f"testbed-expert:{task_id}").choice(keys) if noisy else None
        self.limit = len(self.corridor.rooms) + self.config.slack + 1
        return self._observation()

    def step(self, action: str | None) -> StepResult:
        assert self.corridor is not None, "reset() before step()"
        self.steps += 1
        progress = action is not None and action == self._expert_action()
        admissible = action in self.admissible_actions()
        success = failed = False
        if admissible:
            success, failed = self._apply(action)
        useless = not admissible or action.startswith("examine")
        done = success or failed or self.steps >= self.limit
        return StepResult(self._observation(), SUCCESS_REWARD if success else 0.0, done, success,
                          {"admissible": admissible}, True if progress else False if useless else None)

    def close(self) -> None:
        pass

    # --- state -------------------------------------------------------------------------------
    def _apply(self, action: str) -> tuple[bool, bool]:
        """(success, failed) after the admissible `action`."""
        doors, way, _, _ = self.corridor.rooms[self.room]
        if action == "go back":
            if self.dead_end:
                self.dead_end = False
            else:
                self.room -= 1
        elif action.startswith("go through"):
            if action == f"go through {way} door":
                self.room += 1
            else:
                self.dead_end = True
        elif action.startswith("take"):
            self.key = action.split()[1]
        elif action == "open chest":
            opened = self.key == self.corridor.goal or self.corridor.key_room is None
            return opened, self.key is not None and not opened
        return False, False

    def _last(self) -> bool:
        return self.room == len(self.corridor.rooms) - 1

    def admissible_actions(self) -> list[str]:
        if self.dead_end:
            return ["go back"]
        doors, _, _, objects = self.corridor.rooms[self.room]
        actions = [] if self._last() else [f"go through {d} door" for d in doors]
        if self.room == self.corridor.key_room and self.key is None:
            actions += [f"take {k} key" for k in self.corridor.keys]
        if self._last():
            actions.append("open chest")
        actions += [f"examine {o}" for o in objects]
        return actions + (["go back"] if self.room > 0 else [])

    def _observation(self) -> Observation:
        c = self.corridor
        if self.dead_end:
            text = "A dead end. The only way is back."
        else:
            doors, way, hinted, _ = c.rooms[self.room]
            parts = [f"You are in room {self.room + 1}."]
            if self._last():
                parts.append("A chest stands here.")
            else:
                parts.append(f"Doors: {', '.join(doors)}.")
                if hinted:
                    parts.append(f"A draft comes through the {way} door.")
            if self.room == c.key_room and self.key is None:
                parts.append(f"Keys lie on the floor: {', '.join(c.keys)}.")
            if self.key:
                parts.append(f"You carry the {self.key} key.")
            text = " ".join(parts)
        task = f"reach the last room and open the {c.goal} chest."
        return Observation(text=text, task=task, admissible_actions=self.admissible_actions(), anchor=text)

    # --- expert ------------------------------------------------------------------------------
    def expert_action(self) -> tuple[str, str]:
        """The demonstrator's move: the shortest way (on a task where `expert_key_noise` struck, to
        the chest with the key it picked at random, which may not fit)."""
        action = self._expert_action(self.demonstrated_key)
        if action is None:
            raise NoExpertMove("the agent holds the wrong key: the chest cannot be opened")
        verb = action.split()[0]
        took = "I take a key." if self.demonstrated_key else f"I take the key of the {self.corridor.goal} chest."
        thought = {"go": "I move on.", "take": took, "open": "I open the chest."}[verb]
        if action == "go back":
            thought = "This is a dead end."
        return thought, action

    def _expert_action(self, key: str | None = None) -> str | None:
        """The shortest way from here to opening the chest with `key` (default: the one that fits),
        knowing the corridor (hinted or not)."""
        c = self.corridor
        key = key or c.goal
        if self.dead_end:
            return "go back"
        if self.key is not None and self.key != key:
            return None
        if c.key_room is not None and self.key is None:
            if self.room < c.key_room:
                return f"go through {c.rooms[self.room][1]} door"
            if self.room > c.key_room:
                return "go back"
            return f"take {key} key"
        return "open chest" if self._last() else f"go through {c.rooms[self.room][1]} door"
