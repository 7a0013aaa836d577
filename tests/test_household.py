import random

import pytest

from agentrl.envs.base import sample_tasks
from agentrl.envs.household import HouseholdEnv
from agentrl.envs.household.world import HELD_OUT_TYPES, IN_DOMAIN_TYPES, make_task


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
