"""The built-in household environment: ALFWorld-like text, microsecond steps, an exact expert.

Rules follow ALFWorld 0.4.2's command wording: `go to R`, `open R`, `close R`, `take O from R`,
`move O to R`, `clean/heat/cool O with A`, `use desklamp 1`, `examine R`, `inventory`, `look`.
The agent holds at most one object; closed receptacles hide their contents.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from agentrl.config import Section
from agentrl.envs.base import NoExpertMove, Observation, StepResult
from agentrl.envs.household.world import (
    APPLIANCES,
    DESK,
    DIFFICULTIES,
    FLAG_APPLIANCE,
    LAMP,
    REQUIRED_FLAG,
    SPLITS,
    Task,
    make_task,
    receptacle_kind,
)
from agentrl.registry import ENVIRONMENTS


class HouseholdEnvConfig(Section):
    """The built-in household environment (pure Python, ALFWorld-like tasks with an exact expert)."""

    type: Literal["household"] = "household"
    """Environment name in the registry."""
    difficulty: Literal["easy", "medium", "hard"] = "easy"
    """Room size, closed containers and distractors; sets the default step limit."""
    seen_layouts: int = Field(40, ge=1)
    """Layouts of the train and L0 splits."""
    unseen_layouts: int = Field(20, ge=1)
    """Layouts of the L1 and L2 splits (never seen in training)."""
    train_size: int = Field(5000, ge=1)
    """Number of distinct training tasks."""
    eval_size: int = Field(100, ge=1)
    """Tasks in each of L0, L1, L2."""
    max_steps: int | None = Field(None, ge=1)
    """Step limit per episode; None takes the difficulty's default."""
    object_variety: int | None = Field(None, ge=1)
    """Object kinds per category (food, dishes, utensils, items); None: all 31 kinds."""
    surface_variety: int | None = Field(None, ge=6)
    """Surface kinds rooms draw from (first N of 12); None: all."""


SUCCESS_REWARD = 10.0
NOTHING = "Nothing happens."
VERB_FLAG = {"clean": "clean", "heat": "hot", "cool": "cool"}


def _listing(items: list[str]) -> str:
    if not items:
        return "nothing"
    named = [f"a {item}" for item in items]
    return named[0] if len(named) == 1 else ", ".join(named[:-1]) + f", and {named[-1]}"


@ENVIRONMENTS.register("household", HouseholdEnvConfig)
class HouseholdEnv:
    def __init__(self, difficulty: str = "easy", seen_layouts: int = 40, unseen_layouts: int = 20,
                 train_size: int = 5000, eval_size: int = 100, max_steps: int | None = None,
                 object_variety: int | None = None, surface_variety: int | None = None):
        if difficulty not in DIFFICULTIES:
            raise ValueError(f"unknown difficulty {difficulty!r}; choose from {list(DIFFICULTIES)}")
        self.difficulty = difficulty
        self.seen_layouts, self.unseen_layouts = seen_layouts, unseen_layouts
        self.train_size, self.eval_size = train_size, eval_size
        self.object_variety, self.surface_variety = object_variety, surface_variety
        self.max_steps = max_steps or DIFFICULTIES[difficulty].max_steps
        self.task: Task | None = None

    # --- tasks -------------------------------------------------------------------------------
    def _task(self, task_id: str) -> Task:
        return make_task(self.difficulty, self.seen_layouts, self.unseen_layouts, task_id,
                         self.object_variety, self.surface_variety)

    def split_tasks(self, split: str) -> list[str]:
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}; household splits are {SPLITS}")
        size = self.train_size if split == "train" else self.eval_size
        return [f"{split}-{i}" for i in range(size)]

    def task_type(self, task_id: str) -> str:
        return self._task(task_id).task_type

    # --- episode -------------------------------------------------------------------------------
    def reset(self, task_id: str) -> Observation:
        self.task = task = self._task(task_id)
        self.location: str | None = None
        self.contents = {r: [] for r in task.layout.receptacles}
        for obj, recep in task.placement:
            self.contents[recep].append(obj)
        self.contents[DESK].append(LAMP)
        self.is_open = {r: False for r in task.layout.openable}
        self.holding: str | None = None
        self.flags: dict[str, set[str]] = {}
        self.lamp_on = False
        self.steps = 0
        self.inspected: set[str] = set()
        text = ("You are in the middle of a room. Looking quickly around you, you see "
                f"{_listing(list(task.layout.receptacles))}.")
        return self._observation(text)

    def step(self, action: str | None) -> StepResult:
        assert self.task is not None, "reset() before step()"
        self.steps += 1
        admissible = action is not None and action in self.admissible_actions()
        progress = self._progress(action, admissible)
        text = self._apply(action) if admissible else NOTHING
        success = self._won()
        done = success or self.steps >= self.max_steps
        reward = SUCCESS_REWARD if success else 0.0
        return StepResult(self._observation(text), reward, done, success,
                          {"admissible": admissible, "task_type": self.task.task_type}, progress)

    def close(self) -> None:
        pass

    def _observation(self, text: str) -> Observation:
        return Observation(text=text, task=self.task.goal, admissible_actions=self.admissible_actions(),
                           anchor=text, info={"task_type": self.task.task_type})

    def _accessible(self, recep: str) -> bool:
        return self.is_open.get(recep, True)

    def _describe(self, recep: str) -> str:
        if not self._accessible(recep):
            return f"The {recep} is closed."
        items = _listing(self.contents[recep])
        if recep in self.is_open:
            return f"The {recep} is open. In it, you see {items}."
        return f"On the {recep}, you see {items}."

    def admissible_actions(self) -> list[str]:
        loc = self.location
        # Every receptacle, the current one included: the list then shows the room's order, so the
        # expert's search (next receptacle after the current one) is a function of the prompt.
        actions = [f"go to {r}" for r in self.task.layout.receptacles]
        if loc is not None:
            if loc in self.is_open:
                actions.append(f"close {loc}" if self.is_open[loc] else f"open {loc}")
            if self._accessible(loc):
                if self.holding is None:
                    actions += [f"take {o} from {loc}" for o in self.contents[loc] if o != LAMP]
                else:
                    actions.append(f"move {self.holding} to {loc}")
            if self.holding is not None and loc in APPLIANCES:
                actions.append(f"{APPLIANCES[loc]} {self.holding} with {loc}")
            if LAMP in self.contents[loc]:
                actions.append(f"use {LAMP}")
            actions.append(f"examine {loc}")
        return actions + ["inventory", "look"]

    def _apply(self, action: str) -> str:
        verb, _, rest = action.partition(" ")
        loc = self.location
        if verb == "go":
            self.location = recep = rest.removeprefix("to ")
            if self._accessible(recep):
                self.inspected.add(recep)
            return f"You arrive at {recep}. {self._describe(recep)}"
        if verb == "open":
            self.is_open[loc] = True
            self.inspected.add(loc)
            return f"You open the {loc}. {self._describe(loc)}"
        if verb == "close":
            self.is_open[loc] = False
            return f"You close the {loc}."
        if verb == "take":
            obj = rest.rsplit(" from ", 1)[0]
            self.contents[loc].remove(obj)
            self.holding = obj
            return f"You pick up the {obj} from the {loc}."
        if verb == "move":
            obj, self.holding = self.holding, None
            self.contents[loc].append(obj)
            return f"You move the {obj} to the {loc}."
        if verb in VERB_FLAG:
            self.flags.setdefault(self.holding, set()).add(VERB_FLAG[verb])
            return f"You {verb} the {self.holding} using the {loc}."
        if verb == "use":
            self.lamp_on = True
            return f"You turn on the {LAMP}."
        if verb == "examine":
            return self._describe(loc)
        if verb == "inventory":
            return f"You are carrying: a {self.holding}." if self.holding else "You are not carrying anything."
        if loc is None:  # look
            return "You are in the middle of a room."
        return f"You are facing the {loc}. Next to it, you see nothing."

    # --- goal ----------------------------------------------------------------------------------
    def _wanted(self, obj: str | None) -> bool:
        return obj is not None and receptacle_kind(obj) == self.task.object_kind

    def _placed(self) -> int:
        flag = REQUIRED_FLAG.get(self.task.task_type)
        return sum(1 for r, objs in self.contents.items() if receptacle_kind(r) == self.task.target_kind
                   for o in objs if self._wanted(o) and (flag is None or flag in self.flags.get(o, ())))

    def _won(self) -> bool:
        task = self.task
        if task.task_type == "look_at_obj_in_light":
            return self.lamp_on and self._wanted(self.holding) and self.location == DESK
        needed = 2 if task.task_type == "pick_two_obj_and_place" else 1
        return self._placed() >= needed

    def _progress(self, action: str | None, admissible: bool) -> bool | None:
        """Ground-truth judgement of an action (GCD label source "env"): True when it is the
        expert's move, False when it cannot help (inadmissible, or a look/inventory/examine/close
        that changes nothing), None otherwise (another search order may be just as good)."""
        if not admissible:
            return False
        if action == self._expert_action():  # None when the expert has no plan from here
            return True
        if action.split(" ", 1)[0] in ("look", "inventory", "examine", "close"):
            return False
        return None

    # --- expert --------------------------------------------------------------------------------
    def expert_action(self) -> tuple[str, str]:
        """(thought, action): the expert's next move and a one-line reason for it."""
        action = self._expert_action()
        if action is None:
            raise NoExpertMove("the expert has no move from this state: the agent put the object where a "
                               "searching expert does not look")
        kind, verb = self.task.object_kind, action.split(" ", 1)[0]
        if verb in VERB_FLAG:
            thought = f"I {verb} the {kind}."
        elif verb == "take":
            thought = f"I found the {kind}."
        elif verb == "open":
            thought = "I open it to look inside."
        elif self.holding is None:
            thought = f"I search for the {kind}."
        elif self.task.task_type == "look_at_obj_in_light":
            thought = f"I look at the {kind} under the desklamp."
        elif verb == "go" and action.removeprefix("go to ") in APPLIANCES:
            thought = f"I take the {kind} to the {action.removeprefix('go to ')}."
        else:
            thought = f"I put the {kind} in the {self.task.target_kind}."
        return thought, action

    def _expert_action(self) -> str | None:
        """Search receptacles in listing order, take the object, process it, deliver it.

        It acts only on what a searching agent could know: receptacles it has already looked
        into, plus the fixed appliances and desk. It always succeeds within the step limit.
        """
        task, loc, held = self.task, self.location, self.holding
        if held is not None:
            flag = REQUIRED_FLAG.get(task.task_type)
            if flag is not None and flag not in self.flags.get(held, ()):
                appliance = FLAG_APPLIANCE[flag]
                if loc != appliance:
                    return f"go to {appliance}"
                return f"{APPLIANCES[appliance]} {held} with {appliance}"
            if task.task_type == "look_at_obj_in_light":
                return f"go to {DESK}" if loc != DESK else f"use {LAMP}"
            target = next(r for r in task.layout.receptacles if receptacle_kind(r) == task.target_kind)
            if loc != target:
                return f"go to {target}"
            if not self._accessible(target):
                return f"open {target}"
            return f"move {held} to {target}"

        sources = [r for r in task.layout.storage if receptacle_kind(r) != task.target_kind]
        if loc in sources and loc in self.inspected:
            found = [o for o in self.contents[loc] if self._wanted(o)]
            if found:
                return f"take {found[0]} from {loc}"
        if loc in sources and not self._accessible(loc):
            return f"open {loc}"
        seen = [r for r in sources if r in self.inspected and any(map(self._wanted, self.contents[r]))]
        unseen = [r for r in sources if r not in self.inspected]
        return f"go to {(seen or unseen)[0]}" if seen or unseen else None
