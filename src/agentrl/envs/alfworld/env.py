"""ALFWorld (TextWorld engine) behind the environment protocol.

One game per episode; reward 10 on success (the step the task is won), else 0. The observation
is the engine's text; the first one drops the welcome banner and the task sentence (the task is
its own field). Admissible actions are the engine's, minus `help`. The expert is ALFWorld's own:
the PDDL planner (exact) or the hand-coded agent (stochastic, fails sometimes). The planner plans
on demand, when the expert is asked for a move and the agent has left the last plan, so RL pays
nothing for it (re-planning every step, as textworld's `policy_commands` does, costs seconds a
step on the heat/cool games).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field

from agentrl.config import Section
from agentrl.envs.alfworld import speedups
from agentrl.envs.alfworld.games import (L2_TYPES, TASK_TYPES, eval_order, game_file, game_params, list_games,
                                         resolve_data, task_type)
from agentrl.envs.alfworld.observer import Goal, Notebook, observer_action, search_order
from agentrl.envs.base import NoExpertMove, Observation, StepResult
from agentrl.registry import ENVIRONMENTS


class AlfWorldEnvConfig(Section):
    """ALFWorld 0.4.2 (TextWorld engine; `pip install agentrl[alfworld]`). Splits: train, L0 =
    valid_seen, L1 = valid_unseen, L2 = cool and pick-two games of valid_unseen."""

    type: Literal["alfworld"] = "alfworld"
    """Environment name in the registry."""
    data: str | None = None
    """Game data: a folder holding json_2.1.1/ (alfworld-download layout) or the slim archive
    (unpacked once into $AGENTRL_CACHE, default ~/.cache/agentrl); None reads $ALFWORLD_DATA."""
    max_steps: int = Field(50, ge=1)
    """Step limit (50; 30 in the RLVMR / GCD protocol)."""
    train_task_types: list[str] | None = None
    """Task types of the train split (None: all six). For the L2 protocol, the four types other
    than pick_cool_then_place_in_recep and pick_two_obj_and_place."""
    expert: Literal["planner", "handcoded", "observer"] = "planner"
    """Expert for SFT data: the PDDL planner (exact, knows where everything is), ALFWorld's
    hand-coded agent (fails some), or the observer (acts only on what the episode has shown:
    `agentrl.envs.alfworld.observer`; it can label any state a policy reaches, for DAgger)."""
    grouped_actions: bool = False
    """List the admissible actions in the prompt with `go to`, `open`, `close` and `examine` said
    once each ("go to: bed 1, desk 1; open: drawer 1; take ...") instead of once per target:
    about 40% fewer prompt tokens on ALFWorld's lists of 20-50 receptacles."""
    memory: bool = False
    """Give each observation the episode's notebook (receptacles not yet visited, where the
    task's objects were seen, what is held), for the prompt's {memory} field."""


SUCCESS_REWARD = 10.0
NOTHING = "Nothing happens."
TASK_MARKER = "Your task is to: "
USELESS_VERBS = ("look", "inventory", "examine")
"""Moves that never change the world: never progress (a GCD "env" label of bad)."""


def split_intro(feedback: str) -> tuple[str, str]:
    """(observation, task) of the first feedback: '-= Welcome ... =-\\n\\n<room>\\n\\nYour task is to: <task>'."""
    text = feedback.split("=-", 1)[-1] if feedback.lstrip().startswith("-=") else feedback
    room, _, task = text.partition(TASK_MARKER)
    return room.strip(), task.strip()


GROUPED_VERBS = ("go to", "open", "close", "examine")


def group_actions(actions: list[str]) -> str:
    """'go to: bed 1, desk 1; open: drawer 1; take pen 1 from desk 1; look' (the targets of each
    grouped verb in the engine's order, the other actions whole)."""
    groups: dict[str, list[str]] = {}
    rest = []
    for action in actions:
        verb = next((v for v in GROUPED_VERBS if action.startswith(v + " ")), None)
        if verb is None:
            rest.append(action)
        else:
            groups.setdefault(verb, []).append(action[len(verb) + 1:])
    return "; ".join([f"{verb}: {', '.join(targets)}" for verb, targets in groups.items()] + rest)


def expert_thought(action: str) -> str:
    verb = action.split(" ", 1)[0]
    return {"go": "I need to look there next.", "take": "This is the object I need.",
            "open": "I open it to see inside.", "move": "I put the object where the task wants it.",
            "use": "I turn on the light to look at the object."}.get(verb, f"Next I {verb} it.")


@ENVIRONMENTS.register("alfworld", AlfWorldEnvConfig)
class AlfWorldEnv:
    def __init__(self, data: str | None = None, max_steps: int = 50,
                 train_task_types: list[str] | None = None, expert: str = "planner", grouped_actions: bool = False,
                 memory: bool = False):
        import textworld
        from alfworld.agents.environment.alfred_tw_env import AlfredDemangler, AlfredExpert
        from textworld.envs import PddlEnv

        speedups.install()
        self.root: Path = resolve_data(data)
        self.max_steps = max_steps
        self.train_types = tuple(train_task_types or TASK_TYPES)
        unknown = set(self.train_types) - set(TASK_TYPES)
        if unknown:
            raise ValueError(f"unknown ALFWorld task types {sorted(unknown)}; valid: {list(TASK_TYPES)}")
        if expert not in ("planner", "handcoded", "observer"):
            raise ValueError(f"unknown ALFWorld expert {expert!r}; choose planner, handcoded or observer")
        self.expert, self.grouped_actions, self.memory = expert, grouped_actions, memory
        self._pddl = PddlEnv(textworld.EnvInfos(won=True, admissible_commands=True))
        self._env = AlfredDemangler(self._pddl, shuffle=False)
        if expert == "handcoded":
            self._env = AlfredExpert(self._env, expert_type="handcoded")
        self._plan: list[str] = []
        self._splits: dict[str, list[str]] = {}
        self.game_id: str | None = None

    # --- tasks ---------------------------------------------------------------------------------
    def split_tasks(self, split: str) -> list[str]:
        if split not in ("train", "l0", "l1", "l2"):
            raise ValueError(f"unknown split {split!r}; ALFWorld splits are train, l0, l1, l2")
        if split not in self._splits:
            games = list_games(self.root, split, self.train_types if split == "train" else TASK_TYPES)
            self._splits[split] = games if split == "train" else eval_order(games)
        return self._splits[split]

    def task_type(self, task_id: str) -> str:
        return task_type(task_id)

    # --- episode -------------------------------------------------------------------------------
    def reset(self, task_id: str) -> Observation:
        self._env.load(str(game_file(self.root, task_id)))
        self.game_id, self.steps, self._plan = task_id, 0, []
        self.state = self._env.reset()
        text, self.task = split_intro(self.state.feedback)
        self.notebook = Notebook.start(self.task, text)
        return self._observation(text)

    def step(self, action: str | None) -> StepResult:
        assert self.game_id is not None, "reset() before step()"
        self.steps += 1
        admissible = action is not None and action in self.state.admissible_commands
        progress = self._progress(action, admissible)
        self._plan = self._plan[1:] if self._plan and action == self._plan[0] else []
        if action is None:
            text = NOTHING  # no parseable action: the engine gets no command, the step still counts
        else:
            self.state, _, _ = self._env.step(action)
            text = self.state.feedback.strip()
        self.notebook.record(action, text, self.state.admissible_commands)
        success = bool(self.state["won"])
        done = success or self.steps >= self.max_steps
        return StepResult(self._observation(text), SUCCESS_REWARD if success else 0.0, done, success,
                          {"admissible": admissible, "task_type": task_type(self.game_id)}, progress)

    def close(self) -> None:
        self._env.close()

    def prepare(self) -> None:
        """Build every train, L0 and L1 game file now (`agentrl prepare`) rather than on first use."""
        for game in {g for split in ("train", "l0", "l1") for g in self.split_tasks(split)}:
            game_file(self.root, game)

    def _observation(self, text: str) -> Observation:
        actions = [a for a in self.state.admissible_commands if a != "help"]
        return Observation(text=text, task=self.task, admissible_actions=actions, anchor=text,
                           info={"task_type": task_type(self.game_id)},
                           actions_text=group_actions(actions) if self.grouped_actions else None,
                           memory=self.notebook.text() if self.memory else None)

    # --- expert --------------------------------------------------------------------------------
    def _progress(self, action: str | None, admissible: bool) -> bool | None:
        """GCD "env" label: inadmissible and look/inventory/examine moves are bad; the expert's
        move is good while the agent follows a plan the expert made; else unknown."""
        if not admissible:
            return False
        if self._plan and action == self._plan[0]:
            return True
        return False if action.split(" ", 1)[0] in USELESS_VERBS else None

    def expert_action(self) -> tuple[str, str]:
        if self.expert == "observer":
            goal = Goal.from_params(task_type(self.game_id), game_params(self.root, self.game_id))
            action = observer_action(self.notebook, goal, self.state.admissible_commands, search_order(self.root))
            if action is None or action not in self.state.admissible_commands:
                raise NoExpertMove(f"ALFWorld game {self.game_id}: the observer has no move from here")
            return expert_thought(action), action
        if self.expert == "handcoded":
            plan = self.state.get("extra.expert_plan") or []
        else:
            if not self._plan:  # the same call textworld makes for `policy_commands`
                self._plan = list(self._pddl._pddl_state.replan(self._pddl._entity_infos) or [])
            plan = self._plan
        if not plan or plan[0] not in self.state.admissible_commands:
            raise NoExpertMove(f"ALFWorld game {self.game_id}: the {self.expert} expert has no move from here")
        return expert_thought(plan[0]), plan[0]


__all__ = ["AlfWorldEnv", "L2_TYPES", "TASK_TYPES"]
