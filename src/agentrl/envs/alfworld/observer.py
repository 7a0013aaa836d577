"""An ALFWorld expert a policy can imitate: it acts only on what the episode has shown, and a
notebook of what that was, which the prompt can show.

The PDDL planner knows where every object is and walks straight to the mug in cabinet 7: a policy
that cannot see that learns noise from its search. The observer searches instead, and every move
it makes is a function of what the agent has seen:
- it searches receptacles in a fixed order of preference for the object it needs: receptacle
  kinds ranked by how often the train games' initial states put that object in one receptacle of
  that kind (`search_order`, counted from the train split), then by number;
- it opens a closed receptacle it came to search, and takes the object as soon as the admissible
  actions offer it;
- it goes back to where it saw an object it still needs, then cleans / heats / cools it at the
  first sink / microwave / fridge, turns on a lamp it has seen (or searches for one), and puts the
  object in the first receptacle of the goal's kind (the one it used already, for pick-two).

The `Notebook` is the record it decides from: the receptacles not yet visited, where the objects
the task names were seen, what the agent holds and what it has done to it. It is written from the
agent's own moves and the engine's answers, whoever chose the moves, so the observer can label any
state a policy reaches (DAgger). Rendered into the prompt (`env.memory`), it shows the policy what
a window of 2 steps cannot: where it has already looked.
"""

from __future__ import annotations

import collections
import functools
import re
from dataclasses import dataclass, field
from pathlib import Path

PROCESS = {"pick_clean_then_place_in_recep": ("clean", ("sinkbasin", "bathtubbasin")),
           "pick_heat_then_place_in_recep": ("heat", ("microwave",)),
           "pick_cool_then_place_in_recep": ("cool", ("fridge",))}
"""Task type -> (verb, receptacle kinds that do it, first preferred)."""
DONE = {"clean": "cleaned", "heat": "heated", "cool": "cooled"}


@functools.lru_cache(maxsize=4)
def search_order(root: Path) -> dict[str, list[str]]:
    """Object kind -> receptacle kinds, most likely first: the share of receptacles of a kind
    that hold the object in the train games' initial states (kinds that never do are left out)."""
    holds: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    present: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for problem in sorted((root / "json_2.1.1" / "train").glob("*/*/initial_state.pddl")):
        text = problem.read_text()
        objects = dict(re.findall(r"\(objectType (\S+) (\S+)Type\)", text))
        receptacles = dict(re.findall(r"\(receptacleType (\S+) (\S+)Type\)", text))
        kinds = collections.Counter(kind.lower() for kind in receptacles.values())
        for obj in {kind.lower() for kind in objects.values()}:
            present[obj].update(kinds)
        for obj, recep in re.findall(r"\(inReceptacle (\S+) (\S+)\)", text):
            if obj in objects and recep in receptacles:
                holds[objects[obj].lower()][receptacles[recep].lower()] += 1
    return {obj: sorted(counts, key=lambda kind: (-counts[kind] / present[obj][kind], kind))
            for obj, counts in holds.items()}


def kind_of(name: str) -> str:
    """'cabinet 12' -> 'cabinet'."""
    return name.rsplit(" ", 1)[0]


def number_of(name: str) -> int:
    tail = name.rsplit(" ", 1)[-1]
    return int(tail) if tail.isdigit() else 0


def seen_objects(feedback: str) -> list[str]:
    """The objects a feedback lists after 'you see' ('a apple 1, a bread 2, and a cup 1.')."""
    if "you see" not in feedback or "you see nothing" in feedback:
        return []
    listed = feedback.split("you see", 1)[1].split(".", 1)[0]
    items = [item.strip() for item in re.split(r",|\band\b", listed)]
    return [item[2:] if item.startswith("a ") else item for item in items if item]


@dataclass
class Notebook:
    """What one episode has shown the agent (see the module docstring)."""

    task: str
    receptacles: list[str]
    location: str | None = None
    visited: set[str] = field(default_factory=set)
    closed: set[str] = field(default_factory=set)
    where: dict[str, str] = field(default_factory=dict)
    """object -> the receptacle it was last seen in."""
    holding: str | None = None
    done_to: dict[str, set[str]] = field(default_factory=dict)
    """object -> what was done to it (clean, heat, cool)."""
    placed: list[tuple[str, str]] = field(default_factory=list)
    """(object, receptacle) of every object put down."""

    @classmethod
    def start(cls, task: str, first_observation: str) -> Notebook:
        return cls(task=task, receptacles=sorted(seen_objects(first_observation), key=lambda r: (kind_of(r), number_of(r))))

    def record(self, action: str | None, feedback: str, admissible: list[str]) -> None:
        """Update from the agent's move, the engine's answer and the actions now admissible."""
        if action is None or feedback.startswith("Nothing happens"):
            return
        verb = action.split(" ", 1)[0]
        if action.startswith("go to "):
            self.location = action[len("go to "):]
            self.visited.add(self.location)
            if "is closed" in feedback:
                self.closed.add(self.location)
            else:
                self._saw(self.location, feedback)
            # Receptacles that share this spot (stoveburners 1 and 2) cannot be gone to from here:
            # one that opens is still to search, the others show their objects as takeable.
            for recep in self.receptacles:
                if recep != self.location and f"go to {recep}" not in admissible:
                    if f"open {recep}" in admissible:
                        self.closed.add(recep)
                    else:
                        self.visited.add(recep)
        elif verb == "open":
            recep = action[len("open "):]
            self.closed.discard(recep)
            self.visited.add(recep)
            self._saw(recep, feedback)
        elif verb == "close":
            self.closed.add(action[len("close "):])
        elif verb == "take":
            obj = action[len("take "):].split(" from ", 1)[0]
            self.holding = obj
            self.where.pop(obj, None)
        elif verb == "move":
            obj, recep = action[len("move "):].split(" to ", 1)
            self.holding = None
            self.where[obj] = recep
            self.placed.append((obj, recep))
        elif verb in ("clean", "heat", "cool"):
            self.done_to.setdefault(action[len(verb) + 1:].split(" with ", 1)[0], set()).add(verb)
        for command in admissible:  # what can be taken from here is in sight
            if command.startswith("take ") and " from " in command:
                obj, recep = command[len("take "):].split(" from ", 1)
                self.where[obj] = recep

    def _saw(self, recep: str, feedback: str) -> None:
        for obj in [o for o, r in self.where.items() if r == recep]:
            del self.where[obj]
        for obj in seen_objects(feedback):
            self.where[obj] = recep

    def text(self) -> str:
        """The record a prompt shows: where the agent is, the receptacles not yet visited, where
        the objects the task names were seen and were put, what is held."""
        words = set(re.findall(r"[a-z]+", self.task.lower()))
        unvisited = [r for r in self.receptacles if r not in self.visited]
        put = [f"{obj} in {recep}" for obj, recep in self.placed]
        seen = [f"{obj} in {recep}" for obj, recep in sorted(self.where.items())
                if kind_of(obj) in words and f"{obj} in {recep}" not in put]
        held = "nothing"
        if self.holding:
            held = self.holding + "".join(f" ({DONE[verb]})" for verb in sorted(self.done_to.get(self.holding, ())))
        return (f"At: {self.location or 'the middle of the room'}. Not visited: {', '.join(unvisited) or 'none'}. "
                f"Seen: {'; '.join(seen) or 'nothing'}. Put: {'; '.join(put) or 'nothing'}. Holding: {held}.")


@dataclass
class Goal:
    """The task's objects, from the game's pddl_params."""

    task_type: str
    target: str
    parent: str
    lamp: str

    @classmethod
    def from_params(cls, task_type: str, params: dict) -> Goal:
        return cls(task_type, params["object_target"].lower(), params["parent_target"].lower(),
                   params["toggle_target"].lower())


def observer_action(book: Notebook, goal: Goal, admissible: list[str], order: dict[str, list[str]]) -> str | None:
    """The observer's next move from the notebook and the admissible actions (None: it has none)."""
    at = book.location
    process = PROCESS.get(goal.task_type)
    pick_two = goal.task_type == "pick_two_obj_and_place"
    placed = {obj for obj, recep in book.placed if kind_of(recep) == goal.parent}

    if book.holding and kind_of(book.holding) != goal.target:  # not what the task needs: put it down
        move = f"move {book.holding} to {at}"
        return move if move in admissible else _go_to(book, [r for r in book.receptacles if r != at][:1])

    if book.holding:
        obj = book.holding
        if process and process[0] not in book.done_to.get(obj, set()):
            verb, kinds = process
            use = [r for kind in kinds for r in book.receptacles if kind_of(r) == kind][:1]
            if at in use:
                command = f"{verb} {obj} with {at}"
                return command if command in admissible else None
            return _go_to(book, use)
        if goal.lamp:
            lamps = [o for o, r in sorted(book.where.items()) if kind_of(o) == goal.lamp]
            for lamp in lamps:
                if f"use {lamp}" in admissible:
                    return f"use {lamp}"
            if lamps:
                return _go_to(book, [book.where[lamps[0]]])
            return _search(book, goal.lamp, admissible, order)
        targets = [recep for obj2, recep in book.placed if obj2 in placed][:1] or \
            [r for r in book.receptacles if kind_of(r) == goal.parent][:1]
        if at in targets:
            move = f"move {obj} to {at}"
            if move in admissible:
                return move
            return f"open {at}" if f"open {at}" in admissible else None
        return _go_to(book, targets)

    wanted = [o for o in book.where if kind_of(o) == goal.target and o not in placed
              and not (pick_two and placed and book.where[o] in {r for _, r in book.placed})]
    for obj in sorted(wanted):
        if f"take {obj} from {book.where[obj]}" in admissible:
            return f"take {obj} from {book.where[obj]}"
    if wanted:
        return _go_to(book, [book.where[sorted(wanted)[0]]])
    return _search(book, goal.target, admissible, order)


def _search(book: Notebook, kind: str, admissible: list[str], order: dict[str, list[str]]) -> str | None:
    """Open the receptacle the agent came to search if it is closed, else go to the next one."""
    at = book.location
    if at is not None and at in book.closed and f"open {at}" in admissible:
        return f"open {at}"
    rank = {k: i for i, k in enumerate(order.get(kind, []))}
    candidates = [r for r in book.receptacles if r not in book.visited]
    candidates.sort(key=lambda r: (rank.get(kind_of(r), len(rank)), kind_of(r), number_of(r)))
    if candidates and f"go to {candidates[0]}" not in admissible and f"open {candidates[0]}" in admissible:
        return f"open {candidates[0]}"  # it shares this spot
    return _go_to(book, candidates[:1])


def _go_to(book: Notebook, receptacles: list[str]) -> str | None:
    return f"go to {receptacles[0]}" if receptacles else None
