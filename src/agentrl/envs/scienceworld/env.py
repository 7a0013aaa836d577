"""ScienceWorld (Java engine over py4j) behind the environment protocol.

One JVM per environment (heap bounded by `jvm_heap`; py4j's `die_on_exit` ends it when its Python
process goes, crash or Ctrl-C included). Reward is the score delta (score 0..100, -100 when the
agent fails, e.g. focusing on the wrong object, which ends the episode; 0 with `failure_penalty`
off); success means score 100.
The expert replays the gold path generated at load.

Prompts: a state has hundreds of valid actions (median ~8.7k characters as a flat list), and the
engine's parser also takes free text that is not in that list (14% of gold-path actions are not).
So the prompt shows the action templates and the objects in view (`objects_budget` characters);
`admissible_actions` holds the engine's full valid list only with `valid_actions: true`.

Cost per step (measured, benchmarks/env_throughput.py): the engine's own Python wrapper makes 8
py4j round trips per step plus one per element of each list it converts (~230 for a 115-action
valid list), and the valid-action enumeration itself takes ~8 ms on more than one core of its
JVM. Here a step is 4 round trips (step, score, completed, the objects joined into one string in
the JVM), and the valid list, when asked for, one more: ~600 steps/s without it, ~100 with it,
against ~50 through the wrapper.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Literal

from pydantic import Field, model_validator

from agentrl.config import ConfigError, Section
from agentrl.envs.base import NoExpertMove, Observation, Rejected, StepResult
from agentrl.registry import ENVIRONMENTS


class ScienceWorldEnvConfig(Section):
    """ScienceWorld (`pip install agentrl[scienceworld]`, needs Java 11+), RLVMR splits."""

    type: Literal["scienceworld"] = "scienceworld"
    """Environment name in the registry."""
    reward_only: ClassVar[tuple[str, ...]] = ("failure_penalty",)
    """Fields that change only the reward: the expert's episodes (and a tokenizer learnt from
    them) do not depend on them, so changing one does not remake them (`pipeline.text_settings`)."""
    splits_dir: str | None = None
    """Folder holding L0_idx.json, L1_idx.json, L2_idx.json ({"train": [[task, variation], ...],
    "test": [...]}); the L0/L1/L2 evaluation splits are their "test" lists."""
    train_split: Literal["l0", "l1", "l2"] = "l0"
    """Whose "train" list is the train split (L0 and L1 share one; L2 holds out 10 task types)."""
    max_steps: int = Field(30, ge=1)
    """Step limit per episode."""
    simplification: str = "easy"
    """ScienceWorld simplification string (comma-separated; "" for none)."""
    jvm_heap: str = "512m"
    """-Xmx of each environment's JVM (one JVM per environment)."""
    objects_budget: int = Field(1500, ge=100)
    """Characters of the objects-in-view list in a prompt (longer lists are cut)."""
    valid_actions: bool = False
    """List the engine's valid actions in every observation (`admissible_actions`; prompts do
    not show them). Costs ~8 ms of more than one core a step: ~100 steps/s instead of ~600."""
    jvm_options: str = ""
    """Extra JVM options of each environment's JVM (e.g. "-XX:ActiveProcessorCount=1")."""
    gold_path: bool = True
    """Generate the gold path at each reset: the expert (`expert_action`) and each step's
    `progress` (GCD's env labels) follow it. The engine simulates it, which takes minutes of JVM
    time for some variations (inclined-plane-*); false skips it (no expert, progress unknown)."""
    train_task_types: list[str] | None = None
    """Task names the train split keeps (None: all of its types); the evaluation splits keep all."""
    expert_teleports: bool = False
    """The expert teleports where the gold path walks door to door (each run of `open door to X`,
    `go to X` becomes one `teleport to` its last room; the "easy" simplification has teleport and
    opens every door): a find-* path takes 6 steps instead of 12, and the policy learns to go
    straight to the room the task needs. Paths that come out shorter can fail (life stages move
    on with time): expert data keeps only episodes that finish."""
    memory: bool = False
    """Give each observation the episode's notebook (the room the agent is in, the rooms it has
    been in, the last 12 moves the engine carried out), for the prompt's {memory} field."""
    reject_unparsed: bool = False
    """A move the engine's parser does not understand (or a reply with no action) is rejected
    rather than played (`try_step`): nothing changes, no step is counted, and with
    `sampling.retries` the policy samples again. False: it is played as a no-op step."""
    failure_penalty: bool = True
    """A failed task (the engine's score -100, e.g. after focusing on the wrong object, which ends
    the episode) is rewarded as the engine scores it: -100 less the points held. False: it counts
    0, so an episode's return is its score clipped at 0, the figure ScienceWorld's paper averages
    (`agentrl compare --metric score`), and RL ranks a group's episodes by the points they reached
    rather than first by whether they failed."""

    @model_validator(mode="after")
    def _teleport_exists(self):
        if self.expert_teleports and not {"easy", "teleportAction"} & set(self.simplification.split(",")):
            raise ValueError(f"env.expert_teleports: the simplification {self.simplification!r} has no teleport "
                             f"action (use 'easy', or add 'teleportAction')")
        return self


NOT_UNDERSTOOD = "No known action matches that input."
SPLIT_FILES = {"l0": "L0_idx.json", "l1": "L1_idx.json", "l2": "L2_idx.json"}
OPEN_DOOR, GO, TELEPORT = "open door to ", "go to ", "teleport to "
ARRIVED = re.compile(r"You (?:move|teleport) to the (.+?)\.")
ROOM = re.compile(r"called the (.+?)\.")
NOT_NOTED = (OPEN_DOOR, GO, TELEPORT, "look around", "inventory", "task")


def teleported(gold: list[str]) -> list[str]:
    """`gold` with each walk (`open door to X`, `go to X`, repeated) one `teleport to` its end."""
    out, i = [], 0
    while i < len(gold):
        j = i
        while j + 1 < len(gold) and gold[j].startswith(OPEN_DOOR) and gold[j + 1] == GO + gold[j][len(OPEN_DOOR):]:
            j += 2
        if j > i:
            out.append(TELEPORT + gold[j - 1][len(GO):])
            i = j
        else:
            out.append(gold[i])
            i += 1
    return out


@dataclass
class Notebook:
    """What one episode has shown the agent: where it is, the rooms it has been in (in the order
    it came), and the moves the engine carried out other than getting about and looking around
    (the last `keep`): a plan's progress, which a window of the last steps loses."""

    room: str
    visited: list[str]
    done: list[str] = field(default_factory=list)
    keep: int = 12

    @classmethod
    def start(cls, first_observation: str) -> Notebook:
        found = ROOM.search(first_observation)
        room = found.group(1) if found else "unknown"
        return cls(room, [room])

    def record(self, action: str | None, feedback: str) -> None:
        """Update from the agent's move and the engine's answer."""
        if action is None or feedback.startswith(NOT_UNDERSTOOD):
            return
        arrived = ARRIVED.match(feedback)
        if arrived:
            self.room = arrived.group(1)
            if self.room not in self.visited:
                self.visited.append(self.room)
        elif not action.startswith(NOT_NOTED):
            self.done = (self.done + [action])[-self.keep:]

    def text(self) -> str:
        return (f"In: {self.room}. Been in: {', '.join(self.visited)}. "
                f"Done: {'; '.join(self.done) or 'nothing yet'}.")


def read_split(path: Path, part: str) -> list[tuple[int, int]]:
    """[(task_index, variation), ...] of one part ("train" / "test") of an RLVMR split file, the
    task types in turn (a variation of each, then a second of each, ...): the files list a type's
    variations together, so the first N of a split (evaluation's `eval.episodes`) cover every type."""
    if not path.is_file():
        raise ConfigError(f"env.splits_dir: ScienceWorld split file {path} does not exist")
    try:
        pairs = [(int(t), int(v)) for t, v in json.loads(path.read_text())[part]]
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as err:
        raise ConfigError(f"{path}: expected {{'train': [[task, variation], ...], 'test': [...]}} ({err!r})") from None
    by_task: dict[int, list[tuple[int, int]]] = {}
    for pair in pairs:
        by_task.setdefault(pair[0], []).append(pair)
    return [pair for turn in itertools.zip_longest(*by_task.values()) for pair in turn if pair is not None]


@ENVIRONMENTS.register("scienceworld", ScienceWorldEnvConfig)
class ScienceWorldEnv:
    def __init__(self, splits_dir: str | None = None, train_split: str = "l0", max_steps: int = 30,
                 simplification: str = "easy", jvm_heap: str = "512m", objects_budget: int = 1500,
                 valid_actions: bool = False, jvm_options: str = "", gold_path: bool = True,
                 train_task_types: list[str] | None = None, expert_teleports: bool = False, memory: bool = False,
                 reject_unparsed: bool = False, failure_penalty: bool = True):
        from scienceworld import ScienceWorldEnv as Engine

        logging.getLogger("py4j").setLevel(logging.CRITICAL)  # a dead JVM floods the log otherwise
        self.splits_dir = Path(splits_dir) if splits_dir else None
        self.train_split, self.max_steps = train_split, max_steps
        self.simplification, self.objects_budget, self.valid_actions = simplification, objects_budget, valid_actions
        self.gold_path, self.train_task_types = gold_path, train_task_types
        self.expert_teleports, self.memory, self.reject_unparsed = expert_teleports, memory, reject_unparsed
        self.failure_penalty = failure_penalty
        previous = os.environ.get("JAVA_TOOL_OPTIONS")
        os.environ["JAVA_TOOL_OPTIONS"] = f"-Xmx{jvm_heap} {jvm_options}".strip()  # read by the JVM launched now
        try:
            self._engine = Engine("", envStepLimit=10**6)  # our step limit, not the engine's
        finally:
            if previous is None:
                os.environ.pop("JAVA_TOOL_OPTIONS")
            else:
                os.environ["JAVA_TOOL_OPTIONS"] = previous
        self._server = self._engine.server
        self._join = self._engine._gateway.jvm.java.lang.String.join
        self.task_names: list[str] = self._strings(self._server.getTaskNames())
        self.templates: list[str] = []  # the engine's action templates: it lists them once a task is loaded
        self._splits: dict[str, list[str]] = {}
        self.task_id: str | None = None

    # --- tasks ---------------------------------------------------------------------------------
    def split_tasks(self, split: str) -> list[str]:
        if split not in ("train", *SPLIT_FILES):
            raise ValueError(f"unknown split {split!r}; ScienceWorld splits are train, l0, l1, l2")
        if self.splits_dir is None:
            raise ConfigError("env.splits_dir: ScienceWorld splits not configured: set env.splits_dir to the folder "
                             "holding L0_idx.json, L1_idx.json and L2_idx.json")
        if split not in self._splits:
            name = SPLIT_FILES[self.train_split if split == "train" else split]
            pairs = read_split(self.splits_dir / name, "train" if split == "train" else "test")
            for task, _ in pairs:
                if not 0 <= task < len(self.task_names):
                    raise ValueError(f"{self.splits_dir / name}: task index {task} out of range "
                                     f"(ScienceWorld has {len(self.task_names)} tasks)")
            if split == "train" and self.train_task_types is not None:
                unknown = sorted(set(self.train_task_types) - set(self.task_names))
                if unknown:
                    raise ConfigError(f"env.train_task_types: unknown ScienceWorld task(s) {unknown}; the tasks are "
                                      f"{', '.join(self.task_names)}")
                kept = {self.task_names.index(name) for name in self.train_task_types}
                pairs = [(t, v) for t, v in pairs if t in kept]
            self._splits[split] = [f"{self.task_names[t]}/{v}" for t, v in pairs]
        return self._splits[split]

    def task_type(self, task_id: str) -> str:
        return task_id.rsplit("/", 1)[0]

    # --- episode -------------------------------------------------------------------------------
    def reset(self, task_id: str) -> Observation:
        name, _, variation = task_id.rpartition("/")
        if name not in self.task_names or not variation.isdigit():
            raise ValueError(f"ScienceWorld task id {task_id!r} is not '<task name>/<variation>'")
        self._engine.load(name, int(variation), simplificationStr=self.simplification, generateGoldPath=self.gold_path)
        self._server.reset()
        if not self.templates:  # before a first load the engine answers with an error message
            self.templates = [t for t in self._engine.get_possible_actions() if t != "reset task"]
        text = self._server.step("look around")  # the engine's own reset does this first move too
        self.task_id, self.steps, self.score = task_id, 0, 0  # the points of this first look count in step 1
        self.gold = self._strings(self._server.getGoldActionSequence()) if self.gold_path else []
        if self.expert_teleports:
            self.gold = teleported(self.gold)
        self.expert_step = 0
        self.task = self._server.freeActionTaskDesc().strip()
        self.notebook = Notebook.start(text)
        return self._observation(text)

    def step(self, action: str | None) -> StepResult:
        assert self.task_id is not None, "reset() before step()"
        return self._played(action, NOT_UNDERSTOOD if action is None else self._server.step(action))

    def try_step(self, action: str | None) -> StepResult | Rejected:
        """With `reject_unparsed`: the move, or `Rejected` where the engine's parser does not
        understand it (the engine answers that before it acts, so nothing changed and no step is
        counted). Otherwise the step."""
        assert self.task_id is not None, "reset() before try_step()"
        if not self.reject_unparsed:
            return self.step(action)
        text = NOT_UNDERSTOOD if action is None else self._server.step(action)
        return Rejected(text.strip()) if text.startswith(NOT_UNDERSTOOD) else self._played(action, text)

    def _played(self, action: str | None, text: str) -> StepResult:
        """The step of `action`, which the engine answered with `text` (counted whatever it was)."""
        self.steps += 1
        on_gold = self.expert_step < len(self.gold) and action == self.gold[self.expert_step]
        self.expert_step = self.expert_step + 1 if on_gold else len(self.gold)  # off the path: no expert
        previous = self.score
        engine_done = False
        if action is not None:
            self.score = int(round(100 * self._server.getScore()))  # the engine's 0..1 as 0..100
            engine_done = bool(self._server.getCompleted())
        reward = (self.score if self.failure_penalty else max(self.score, 0)) - previous
        self.notebook.record(action, text)
        understood = action is not None and not text.startswith(NOT_UNDERSTOOD)
        success = self.score >= 100
        done = success or engine_done or self.score < 0 or self.steps >= self.max_steps
        progress = True if on_gold else (False if not understood else None)
        return StepResult(self._observation(text.strip()), float(reward), done, success,
                          {"admissible": understood, "task_type": self.task_type(self.task_id),
                           "score": self.score}, progress)

    def close(self) -> None:
        process = self._engine._gateway.java_process
        try:
            self._engine.close()
        finally:
            try:
                process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                process.kill()

    def _strings(self, java_list) -> list[str]:
        """A Java list of strings in one round trip (iterating it costs two per element)."""
        joined = self._join("\n", java_list)
        return joined.split("\n") if joined else []

    def _observation(self, text: str) -> Observation:
        names = self._strings(self._server.getPossibleObjects())
        objects = ", ".join(names)
        if len(objects) > self.objects_budget:
            objects = objects[:self.objects_budget].rsplit(", ", 1)[0] + ", ..."
        listing = (f"templates (OBJ = an object): {', '.join(self.templates)}\n"
                   f"objects: {objects}")
        valid = ([a for a in self._strings(self._server.getValidActionObjectCombinations()) if a != "reset task"]
                 if self.valid_actions else [])
        return Observation(text=text, task=self.task, admissible_actions=valid, anchor=text,
                           info={"task_type": self.task_type(self.task_id), "objects": names}, actions_text=listing,
                           memory=self.notebook.text() if self.memory else None)

    # --- expert --------------------------------------------------------------------------------
    def expert_action(self) -> tuple[str, str]:
        if not self.gold_path:
            raise NoExpertMove("ScienceWorld: no expert with env.gold_path: false (no gold path is generated)")
        if self.expert_step >= len(self.gold):
            raise NoExpertMove(f"ScienceWorld {self.task_id}: the agent left the gold path; no expert move")
        return "I follow the plan for this task.", self.gold[self.expert_step]
