"""ScienceWorld (Java engine over py4j) behind the environment protocol.

One JVM per environment (heap bounded by `jvm_heap`; py4j's `die_on_exit` ends it when its Python
process goes, crash or Ctrl-C included). Reward is the score delta (score 0..100, -100 when the
agent fails, e.g. focusing on the wrong object, which ends the episode); success means score 100.
The expert replays the gold path generated at load.

Prompts: a state has hundreds of valid actions (median ~8.7k characters as a flat list), and the
engine's parser also takes free text that is not in that list (14% of gold-path actions are not).
So the prompt shows the action templates and the objects in view (`objects_budget` characters);
`admissible_actions` keeps the engine's full valid list for whoever needs it.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
from pathlib import Path

from agentrl.config import ConfigError
from agentrl.envs.base import NoExpertMove, Observation, StepResult

NOT_UNDERSTOOD = "No known action matches that input."
SPLIT_FILES = {"l0": "L0_idx.json", "l1": "L1_idx.json", "l2": "L2_idx.json"}


def read_split(path: Path, part: str) -> list[tuple[int, int]]:
    """[(task_index, variation), ...] of one part ("train" / "test") of an RLVMR split file."""
    if not path.is_file():
        raise ConfigError(f"env.splits_dir: ScienceWorld split file {path} does not exist")
    try:
        pairs = json.loads(path.read_text())[part]
        return [(int(t), int(v)) for t, v in pairs]
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as err:
        raise ConfigError(f"{path}: expected {{'train': [[task, variation], ...], 'test': [...]}} ({err!r})") from None


class ScienceWorldEnv:
    def __init__(self, splits_dir: str | None = None, train_split: str = "l0", max_steps: int = 30,
                 simplification: str = "easy", jvm_heap: str = "512m", objects_budget: int = 1500):
        from scienceworld import ScienceWorldEnv as Engine

        logging.getLogger("py4j").setLevel(logging.CRITICAL)  # a dead JVM floods the log otherwise
        self.splits_dir = Path(splits_dir) if splits_dir else None
        self.train_split, self.max_steps = train_split, max_steps
        self.simplification, self.objects_budget = simplification, objects_budget
        previous = os.environ.get("JAVA_TOOL_OPTIONS")
        os.environ["JAVA_TOOL_OPTIONS"] = f"-Xmx{jvm_heap}"  # read by the JVM py4j launches now
        try:
            self._engine = Engine("", envStepLimit=10**6)  # our step limit, not the engine's
        finally:
            if previous is None:
                os.environ.pop("JAVA_TOOL_OPTIONS")
            else:
                os.environ["JAVA_TOOL_OPTIONS"] = previous
        self.task_names: list[str] = list(self._engine.get_task_names())
        self.templates = [t for t in self._engine.get_possible_actions() if t != "reset task"]
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
            self._splits[split] = [f"{self.task_names[t]}/{v}" for t, v in pairs]
        return self._splits[split]

    def task_type(self, task_id: str) -> str:
        return task_id.rsplit("/", 1)[0]

    # --- episode -------------------------------------------------------------------------------
    def reset(self, task_id: str) -> Observation:
        name, _, variation = task_id.rpartition("/")
        if name not in self.task_names or not variation.isdigit():
            raise ValueError(f"ScienceWorld task id {task_id!r} is not '<task name>/<variation>'")
        self._engine.load(name, int(variation), simplificationStr=self.simplification, generateGoldPath=True)
        text, self.info = self._engine.reset()
        self.task_id, self.steps, self.score = task_id, 0, 0
        self.gold = list(self._engine.get_gold_action_sequence())
        self.expert_step = 0
        self.task = self.info["taskDesc"].strip()
        return self._observation(text)

    def step(self, action: str | None) -> StepResult:
        assert self.task_id is not None, "reset() before step()"
        self.steps += 1
        on_gold = self.expert_step < len(self.gold) and action == self.gold[self.expert_step]
        self.expert_step = self.expert_step + 1 if on_gold else len(self.gold)  # off the path: no expert
        previous = self.score
        if action is None:
            text, engine_done = NOT_UNDERSTOOD, False
        else:
            text, _, engine_done, self.info = self._engine.step(action)
            self.score = self.info["score"]
        reward = self.score - previous  # from 0 at reset: the points of the reset's own look count
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

    def _observation(self, text: str) -> Observation:
        objects = ", ".join(self._engine.get_possible_objects())
        if len(objects) > self.objects_budget:
            objects = objects[:self.objects_budget].rsplit(", ", 1)[0] + ", ..."
        listing = (f"templates (OBJ = an object): {', '.join(self.templates)}\n"
                   f"objects: {objects}")
        valid = [a for a in self.info["valid"] if a != "reset task"]
        return Observation(text=text, task=self.task, admissible_actions=valid, anchor=text,
                           info={"task_type": self.task_type(self.task_id)}, actions_text=listing)

    # --- expert --------------------------------------------------------------------------------
    def expert_action(self) -> tuple[str, str]:
        if self.expert_step >= len(self.gold):
            raise NoExpertMove(f"ScienceWorld {self.task_id}: the agent left the gold path; no expert move")
        return "I follow the plan for this task.", self.gold[self.expert_step]
