"""Procedural household worlds in the style of ALFWorld: layouts, task generation, splits.

A *layout* is a room: a fixed set of receptacles in a fixed listing order, chosen by a layout id.
A *task* puts objects into a layout and states a goal. Splits:
  train, l0: the four in-domain task types on seen layouts (ids [0, seen_layouts))
  l1:        the same four types on unseen layouts
  l2:        the held-out types (cool, pick-two) on unseen layouts
Everything derives from string seeds, so a task id means the same world on every machine.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from functools import lru_cache

SURFACES = ["countertop", "diningtable", "shelf", "sidetable", "coffeetable", "dresser", "armchair",
            "sofa", "bed", "stoveburner", "cart", "garbagecan"]
CONTAINERS = ["cabinet", "drawer", "safe", "box"]
APPLIANCES = {"sinkbasin 1": "clean", "microwave 1": "heat", "fridge 1": "cool"}
OPENABLE_APPLIANCES = {"microwave 1", "fridge 1"}
DESK = "desk 1"
LAMP = "desklamp 1"

FOOD = ["apple", "potato", "tomato", "egg", "bread", "lettuce"]
DISHES = ["mug", "cup", "plate", "bowl", "pan", "pot"]
UTENSILS = ["knife", "spoon", "fork", "spatula", "ladle"]
ITEMS = ["book", "pen", "pencil", "cellphone", "keychain", "creditcard", "watch", "cd",
         "remotecontrol", "vase", "statue", "alarmclock", "pillow", "laptop"]

TASK_OBJECTS = {
    "pick_and_place_simple": ITEMS + FOOD + DISHES,
    "look_at_obj_in_light": ITEMS,
    "pick_clean_then_place_in_recep": FOOD + DISHES + UTENSILS,
    "pick_heat_then_place_in_recep": FOOD + ["mug", "cup", "plate"],
    "pick_cool_then_place_in_recep": FOOD + DISHES,
    "pick_two_obj_and_place": ITEMS + FOOD + DISHES,
}
TASK_TYPES = list(TASK_OBJECTS)
HELD_OUT_TYPES = ["pick_cool_then_place_in_recep", "pick_two_obj_and_place"]
IN_DOMAIN_TYPES = [t for t in TASK_TYPES if t not in HELD_OUT_TYPES]
REQUIRED_FLAG = {"pick_clean_then_place_in_recep": "clean", "pick_heat_then_place_in_recep": "hot",
                 "pick_cool_then_place_in_recep": "cool"}
FLAG_APPLIANCE = {"clean": "sinkbasin 1", "hot": "microwave 1", "cool": "fridge 1"}
SPLITS = ["train", "l0", "l1", "l2"]


@dataclass(frozen=True)
class Difficulty:
    surfaces: tuple[int, int]
    containers: tuple[int, int]
    distractors: tuple[int, int]
    max_steps: int


DIFFICULTIES = {
    "easy": Difficulty(surfaces=(2, 3), containers=(0, 0), distractors=(1, 2), max_steps=15),
    "medium": Difficulty(surfaces=(2, 4), containers=(1, 3), distractors=(2, 4), max_steps=25),
    "hard": Difficulty(surfaces=(3, 6), containers=(2, 5), distractors=(4, 8), max_steps=40),
}


@dataclass(frozen=True)
class Layout:
    receptacles: tuple[str, ...]
    """All receptacles in the room's listing order."""
    openable: frozenset[str]

    @property
    def storage(self) -> list[str]:
        """Where objects can lie: everything but the appliances, in listing order."""
        return [r for r in self.receptacles if r not in APPLIANCES]


@dataclass(frozen=True)
class Task:
    task_id: str
    task_type: str
    layout: Layout
    object_kind: str
    target_kind: str | None
    """Receptacle kind the object must end in (None for look-at-in-light)."""
    placement: tuple[tuple[str, str], ...]
    """(object, receptacle) pairs of the initial state."""

    @property
    def goal(self) -> str:
        kind, target = self.object_kind, self.target_kind
        match self.task_type:
            case "look_at_obj_in_light":
                return f"look at {kind} under the desklamp."
            case "pick_two_obj_and_place":
                return f"put two {kind} in {target}."
            case "pick_and_place_simple":
                return f"put a {kind} in {target}."
        adjective = {"clean": "clean", "hot": "hot", "cool": "cool"}[REQUIRED_FLAG[self.task_type]]
        return f"put a {adjective} {kind} in {target}."


def receptacle_kind(name: str) -> str:
    return name.rsplit(" ", 1)[0]


def allowed_kinds(variety: int | None) -> list[str]:
    """The first `variety` object kinds of each category (None: all)."""
    return [k for group in (FOOD, DISHES, UTENSILS, ITEMS) for k in group[:variety]]


def object_kinds(task_type: str, variety: int | None) -> list[str]:
    allowed = set(allowed_kinds(variety))
    return [k for k in TASK_OBJECTS[task_type] if k in allowed]


@lru_cache(maxsize=4096)
def make_layout(difficulty: str, layout_id: int, surface_variety: int | None = None) -> Layout:
    spec = DIFFICULTIES[difficulty]
    rng = random.Random(f"layout:{difficulty}:{layout_id}")
    surfaces = rng.sample(SURFACES[:surface_variety], rng.randint(*spec.surfaces))
    containers = [rng.choice(CONTAINERS) for _ in range(rng.randint(*spec.containers))]
    names = [f"{kind} 1" for kind in surfaces]
    counts: dict[str, int] = {}
    for kind in containers:
        counts[kind] = counts.get(kind, 0) + 1
        names.append(f"{kind} {counts[kind]}")
    names += [DESK, *APPLIANCES]
    rng.shuffle(names)
    openable = frozenset(n for n in names if receptacle_kind(n) in CONTAINERS) | OPENABLE_APPLIANCES
    return Layout(receptacles=tuple(names), openable=openable)


@lru_cache(maxsize=65536)
def make_task(difficulty: str, seen_layouts: int, unseen_layouts: int, task_id: str,
              object_variety: int | None = None, surface_variety: int | None = None) -> Task:
    split, index = parse_task_id(task_id)
    rng = random.Random(f"task:{difficulty}:{task_id}")
    if split in ("train", "l0"):
        layout_id = rng.randrange(seen_layouts)
    else:
        layout_id = seen_layouts + rng.randrange(unseen_layouts)
    layout = make_layout(difficulty, layout_id, surface_variety)
    task_type = rng.choice(HELD_OUT_TYPES if split == "l2" else IN_DOMAIN_TYPES)
    kind = rng.choice(object_kinds(task_type, object_variety))
    storage = layout.storage

    target_kind = None
    sources = storage
    if task_type != "look_at_obj_in_light":
        target_kind = receptacle_kind(rng.choice([r for r in storage if r != DESK]))
        sources = [r for r in storage if receptacle_kind(r) != target_kind]

    placement = []
    for i in range(2 if task_type == "pick_two_obj_and_place" else 1):
        placement.append((f"{kind} {i + 1}", rng.choice(sources)))
    spec = DIFFICULTIES[difficulty]
    others = [k for k in allowed_kinds(object_variety) if k != kind]
    for other in rng.sample(others, rng.randint(*spec.distractors)):
        placement.append((f"{other} 1", rng.choice(storage)))
    return Task(task_id=task_id, task_type=task_type, layout=layout, object_kind=kind,
                target_kind=target_kind, placement=tuple(placement))


def parse_task_id(task_id: str) -> tuple[str, int]:
    split, sep, index = task_id.rpartition("-")
    if not sep or split not in SPLITS or not index.isdigit():
        raise ValueError(f"bad household task id {task_id!r}: expected '<split>-<index>' with split "
                         f"in {SPLITS}")
    return split, int(index)
