"""A two-step task whose right answer is known, for tests of the learning direction.

Every state offers the same two actions. The episode succeeds (reward 10) only when both steps
take GOOD; BAD at the first step leads to the cellar, where nothing succeeds (each step's `progress`
says whether it kept the way to the garden open; the expert takes GOOD, and has no move in the cellar). Anchors name the
room ("room:hall"), never the rendered prompt, so a test can tell the environment's anchor
from the prompt's text.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

from agentrl.config import Section
from agentrl.envs.base import NoExpertMove, Observation, StepResult
from agentrl.gcd.judge import judge_prompt
from agentrl.prompting import HistoryEntry, format_response, render_prompt
from agentrl.recipe import validate_config
from agentrl.registry import ENVIRONMENTS
from agentrl.rollout.types import StepSample

GOOD, BAD = "open drawer 1", "open cabinet 1"
TEMPLATE = "Task: {task}\nHistory:\n{history}\nObservation: {observation}\nActions: {actions}"


class TwoStepConfig(Section):
    type: Literal["twostep"] = "twostep"


@ENVIRONMENTS.register("twostep", TwoStepConfig)
class TwoStepEnv:
    max_steps = 2

    def split_tasks(self, split: str) -> list[str]:
        return [f"{split}-{i}" for i in range(4)]

    def task_type(self, task_id: str) -> str:
        return "two_step"

    def reset(self, task_id: str) -> Observation:
        self.task, self.room, self.steps = f"reach the garden ({task_id})", "hall", 0
        return self._observation()

    def _observation(self) -> Observation:
        return Observation(f"You are in the {self.room}.", self.task, [GOOD, BAD], anchor=f"room:{self.room}")

    def step(self, action: str | None) -> StepResult:
        self.steps += 1
        if self.steps == 1:
            self.room = "corridor" if action == GOOD else "cellar"
            return StepResult(self._observation(), 0.0, False, False, progress=action == GOOD)
        success = self.room == "corridor" and action == GOOD
        self.room = "garden" if success else "cellar"
        return StepResult(self._observation(), 10.0 if success else 0.0, True, success, progress=success)

    def expert_action(self) -> tuple[str, str]:
        if self.room == "cellar":
            raise NoExpertMove("nothing succeeds from the cellar")
        return "the drawer leads on", GOOD

    def close(self) -> None:
        pass


def config(run_dir, steps: int = 1, temperature: float = 1.0, **rl):
    return validate_config({
        "seed": 7, "run_dir": str(run_dir), "env": {"type": "twostep"},
        "prompt": {"template": TEMPLATE, "history_length": 1},
        "sampling": {"max_new_tokens": 24, "temperature": temperature},
        "rl": {"steps": steps, "tasks_per_step": 2, "group_size": 4, "mini_batch_size": 64,
               "micro_batch_tokens": 4096, "optim": {"lr": 1e-3}, **rl},
        "eval": {"episodes": 2, "splits": ["l0"]},
    })


def response(action: str) -> str:
    return format_response("choose", action)


def first_prompt(task_id: str = "train-0") -> str:
    env = TwoStepEnv()
    return render_prompt(TEMPLATE, env.reset(task_id), [], 0, 1)


def write_choice_data(path: Path, actions: tuple[str, ...] = (GOOD, BAD), judgments: bool = False) -> None:
    """`actions` equally often in every state the task can reach: a policy fine-tuned on this
    picks each with probability about 1 / len(actions); with `judgments`, also either verdict on
    every such action, as GCD's judge is asked (`judge_prompt`)."""
    env, rows = TwoStepEnv(), []
    for i in range(4):
        for first in (GOOD, BAD):
            obs = env.reset(f"train-{i}")
            prompts = [render_prompt(TEMPLATE, obs, [], 0, 1)]
            after = env.step(first).observation
            prompts.append(render_prompt(TEMPLATE, after, [HistoryEntry(obs.text, first)], 1, 1))
            for prompt in prompts:
                for action in actions:
                    rows.append({"messages": [{"role": "user", "content": prompt},
                                              {"role": "assistant", "content": response(action)}]})
                    if judgments:
                        step = StepSample([], [], [], response(action), action, "", "", prompt=prompt)
                        rows += [{"messages": [{"role": "user", "content": judge_prompt(step)},
                                               {"role": "assistant", "content": verdict}]}
                                 for verdict in ("<think>a loop</think><verdict>bad</verdict>", "<verdict>good</verdict>")]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
