import random

import pytest

from agentrl.envs.base import sample_tasks
from agentrl.envs.household import HouseholdEnv
from agentrl.envs.household.world import (APPLIANCES, DESK, HELD_OUT_TYPES, IN_DOMAIN_TYPES, make_layout, make_task,
                                          receptacle_kind)


@pytest.mark.parametrize("difficulty", ["easy", "medium", "hard"])
def test_expert_solves_every_sampled_task_of_every_split(difficulty):
    env = HouseholdEnv(difficulty)
    rng = random.Random(1)
    for split in ["train", "l0", "l1", "l2"]:
        for task_id in sample_tasks(env, split, 150, rng):
            obs, done = env.reset(task_id), False
            while not done:
                _, action = env.expert_action()
                assert action in obs.admissible_actions, (task_id, action)
                result = env.step(action)
                obs, done = result.observation, result.done
            assert result.success and result.reward == 10.0, task_id
            assert env.steps <= env.max_steps


def test_splits_layouts_and_types():
    env = HouseholdEnv(seen_layouts=10, unseen_layouts=5)
    layouts = {}
    for split in ["train", "l0", "l1", "l2"]:
        tasks = [make_task("easy", 10, 5, t) for t in env.split_tasks(split)[:200]]
        layouts[split] = {t.layout for t in tasks}
        types = {t.task_type for t in tasks}
        assert types == (set(HELD_OUT_TYPES) if split == "l2" else set(IN_DOMAIN_TYPES))
    assert layouts["l0"] <= layouts["train"]
    assert not layouts["l1"] & layouts["train"] and not layouts["l2"] & layouts["train"]
    assert env.split_tasks("l1")[:3] == ["l1-0", "l1-1", "l1-2"]


def test_task_ids_are_deterministic_and_validated():
    assert make_task("easy", 40, 20, "l1-7") == make_task("easy", 40, 20, "l1-7")
    with pytest.raises(ValueError, match="bad household task id"):
        HouseholdEnv().reset("l9-1")


def test_rules_and_texts():
    env = HouseholdEnv()
    obs = env.reset("train-0")
    assert obs.text.startswith("You are in the middle of a room.")
    assert obs.anchor == obs.text
    result = env.step("take moon from sky")
    assert result.observation.text == "Nothing happens." and not result.info["admissible"]
    result = env.step(None)
    assert result.observation.text == "Nothing happens." and env.steps == 2
    while not result.done:
        result = env.step(None)
    assert env.steps == env.max_steps and not result.success and result.reward == 0.0


def test_closed_containers_hide_contents():
    env = HouseholdEnv("hard")
    for i in range(50):
        env.reset(f"train-{i}")
        closed = [r for r in env.task.layout.openable if r.split()[0] in ("cabinet", "drawer", "safe", "box")
                  and env.contents[r]]
        if closed:
            r = closed[0]
            text = env.step(f"go to {r}").observation.text
            assert text.endswith(f"The {r} is closed.")
            assert not any(a.startswith("take") for a in env.admissible_actions())
            text = env.step(f"open {r}").observation.text
            assert env.contents[r][0] in text
            return
    pytest.fail("no closed container with contents found")


def test_variety_limits_the_vocabulary_and_keeps_every_type_solvable():
    env = HouseholdEnv(object_variety=1, surface_variety=6)
    kinds, surfaces = set(), set()
    for split in ["train", "l2"]:
        for task_id in env.split_tasks(split)[:100]:
            env.reset(task_id)
            kinds |= {o.rsplit(" ", 1)[0] for o, _ in env.task.placement}
            surfaces |= {r.rsplit(" ", 1)[0] for r in env.task.layout.receptacles}
            while True:
                result = env.step(env.expert_action()[1])
                if result.done:
                    break
            assert result.success
    assert kinds <= {"apple", "mug", "knife", "book"}
    assert surfaces <= {"countertop", "diningtable", "shelf", "sidetable", "coffeetable", "dresser",
                        "desk", "sinkbasin", "microwave", "fridge"}


def test_random_play_never_breaks_the_progress_labels():
    env = HouseholdEnv(difficulty="medium")
    rng = random.Random(0)
    labels = set()
    for task in sample_tasks(env, "train", 200, rng):
        obs = env.reset(task)
        for _ in range(env.max_steps):
            result = env.step(rng.choice(obs.admissible_actions))
            labels.add(result.progress)
            obs = result.observation
            if result.done:
                break
    assert labels == {True, False, None}


def first_task_of_each_type(env):
    found = {}
    for task_id in [*env.split_tasks("train")[:300], *env.split_tasks("l2")[:100]]:
        found.setdefault(env.task_type(task_id), task_id)
    return found


def expert_until(env, stop):
    """The expert's moves until `stop()`; none of them may end the episode."""
    while not stop():
        assert not env.step(env.expert_action()[1]).done


def test_a_task_is_won_only_when_its_whole_goal_holds():
    env = HouseholdEnv()
    tasks = first_task_of_each_type(env)
    for task_type in ("pick_clean_then_place_in_recep", "pick_heat_then_place_in_recep", "pick_cool_then_place_in_recep"):
        env.reset(tasks[task_type])  # the object delivered untreated
        expert_until(env, lambda: env.holding is not None)
        target = next(r for r in env.task.layout.receptacles if receptacle_kind(r) == env.task.target_kind)
        for action in [f"go to {target}", *([f"open {target}"] if target in env.is_open else []),
                       f"move {env.holding} to {target}"]:
            result = env.step(action)
            assert result.info["admissible"] and not result.done, (task_type, action)
    env.reset(tasks["pick_two_obj_and_place"])  # one of two delivered
    expert_until(env, lambda: env._placed() == 1)
    for task_id in env.split_tasks("train")[:300]:  # the object held in the lamp's light, away from the desk
        if env.task_type(task_id) == "look_at_obj_in_light" and DESK not in dict(make_task("easy", 40, 20, task_id).placement).values():
            env.reset(task_id)
            assert not env.step(f"go to {DESK}").done and not env.step("use desklamp 1").done
            expert_until(env, lambda: env.holding is not None)
            assert env.location != DESK and env.lamp_on
            assert env.step(f"go to {DESK}").success
            break
    else:
        pytest.fail("no look-at task with its object away from the desk")


def test_no_task_starts_with_its_object_in_place():
    env = HouseholdEnv("medium")
    for task_id in [*env.split_tasks("train")[:300], *env.split_tasks("l2")[:100]]:
        task = make_task("medium", 40, 20, task_id)
        if task.target_kind is not None:
            assert all(receptacle_kind(r) != task.target_kind for o, r in task.placement
                       if receptacle_kind(o) == task.object_kind), task_id


def test_looking_examining_and_closing_are_labelled_as_no_help():
    env = HouseholdEnv("hard")
    for i in range(50):
        env.reset(f"train-{i}")
        closed = [r for r in env.task.layout.openable if receptacle_kind(r) in ("cabinet", "drawer", "safe", "box")]
        if closed:
            r = closed[0]
            env.step(f"go to {r}")
            env.step(f"open {r}")
            assert [env.step(a).progress for a in (f"examine {r}", "look", "inventory", f"close {r}")] == [False] * 4
            return
    pytest.fail("no closed container found")


@pytest.mark.parametrize("difficulty", ["easy", "hard"])
def test_a_task_places_exactly_its_own_objects_and_never_targets_the_desk(difficulty):
    """The distractors are other kinds (an extra object of the task's kind would make "put two"
    and "take the first you see" easier than the expert's plan); objects lie in storage, never in an
    appliance, and the target is never an appliance nor the desk (the lamp's place)."""
    env = HouseholdEnv(difficulty)
    for split in ["train", "l1", "l2"]:
        for task_id in env.split_tasks(split)[:100]:
            task = make_task(difficulty, 40, 20, task_id)
            own = [o for o, _ in task.placement if receptacle_kind(o) == task.object_kind]
            assert len(own) == (2 if task.task_type == "pick_two_obj_and_place" else 1), task_id
            assert task.target_kind != receptacle_kind(DESK), task_id
            assert not {r for _, r in task.placement} & set(APPLIANCES), task_id
            assert task.task_type == "look_at_obj_in_light" or f"{task.target_kind} 1" not in APPLIANCES, task_id


@pytest.mark.parametrize("difficulty", ["medium", "hard"])
def test_receptacles_of_a_kind_are_numbered_from_one(difficulty):
    """A room's two drawers are drawer 1 and drawer 2: every receptacle's name is its own."""
    rooms_with_a_second = 0
    for layout_id in range(60):
        names = make_layout(difficulty, layout_id).receptacles
        numbers: dict[str, list[int]] = {}
        for name in names:
            numbers.setdefault(receptacle_kind(name), []).append(int(name.rsplit(" ", 1)[1]))
        assert all(sorted(n) == list(range(1, len(n) + 1)) for n in numbers.values()), names
        rooms_with_a_second += any(len(n) > 1 for n in numbers.values())
    assert rooms_with_a_second > 10

def test_sampled_tasks_cover_the_split_and_each_task_type():
    """With replacement, every task equally likely: 2,000 draws from 100 tasks reach each of them,
    and by type each type about equally often."""
    env = HouseholdEnv(eval_size=100)
    drawn = sample_tasks(env, "l1", 2000, random.Random(0))
    assert set(drawn) == set(env.split_tasks("l1"))
    by_type = sample_tasks(env, "l1", 2000, random.Random(0), by_type=True)
    counts = {t: sum(env.task_type(task) == t for task in by_type) for t in IN_DOMAIN_TYPES}
    assert all(400 <= c <= 600 for c in counts.values()), counts
    assert set(by_type) == set(env.split_tasks("l1"))


def test_every_receptacle_can_be_gone_to_from_anywhere_in_the_rooms_order():
    """The go-to moves list the whole room in its order wherever the agent stands, the current
    receptacle included, so the expert's next search target is a function of the prompt."""
    env = HouseholdEnv("medium")
    obs = env.reset("train-3")
    receptacles = list(env.task.layout.receptacles)
    for receptacle in [*receptacles, receptacles[0]]:
        obs = env.step(f"go to {receptacle}").observation
        assert [a.removeprefix("go to ") for a in obs.admissible_actions if a.startswith("go to ")] == receptacles


def test_each_goal_states_what_wins_it():
    """The goal the agent reads names the object kind, the count, the treatment and the target its
    win checks (ALFWorld's phrasings): "put two X in Y" for pick-two, "put a hot X in Y" after heating."""
    env = HouseholdEnv("medium")
    phrasing = {"pick_and_place_simple": "put a {kind} in {target}.",
                "look_at_obj_in_light": "look at {kind} under the desklamp.",
                "pick_clean_then_place_in_recep": "put a clean {kind} in {target}.",
                "pick_heat_then_place_in_recep": "put a hot {kind} in {target}.",
                "pick_cool_then_place_in_recep": "put a cool {kind} in {target}.",
                "pick_two_obj_and_place": "put two {kind} in {target}."}
    seen = set()
    for split in ["train", "l2"]:
        for task_id in env.split_tasks(split)[:60]:
            task = make_task("medium", 40, 20, task_id)
            assert task.goal == phrasing[task.task_type].format(kind=task.object_kind, target=task.target_kind)
            seen.add(task.task_type)
    assert seen == set(phrasing)
