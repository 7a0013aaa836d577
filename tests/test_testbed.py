"""The credit-assignment testbed: each knob does what it says, the expert solves every split in the
shortest number of steps, and the splits are the compositions they claim."""

import random

import pytest

from agentrl.envs import make_env, testbed
from agentrl.envs.testbed.env import COLOURS, HELD_OUT_GOALS, OBJECTS, SEEN_GOALS, make_corridor
from agentrl.recipe import load_config


def play(env, task_id, choose, limit=200):
    """One episode, stopped at `limit` steps should the environment never end it."""
    obs, steps, result = env.reset(task_id), 0, None
    while (result is None or not result.done) and steps < limit:
        result = env.step(choose(obs))
        obs, steps = result.observation, steps + 1
    return result, steps


@pytest.mark.parametrize("knobs", [{}, {"horizon": 7, "delay": 5, "doors": 4, "distractors": 3, "key_choices": 4},
                                   {"key_choices": 0, "hint_rate": 0.0}, {"horizon": 1, "delay": 0},
                                   {"key_choices": 0, "expert_key_noise": 1.0}])  # no key to take wrong
def test_expert_solves_every_split_in_the_shortest_number_of_steps(knobs):
    env = testbed.TestbedEnv(**knobs)
    for split in ("train", "l0", "l1", "l2"):
        for task_id in env.split_tasks(split)[:30]:
            result, steps = play(env, task_id, lambda obs: env.expert_action()[1])
            rooms = int(env.task_type(task_id).rsplit("_", 1)[1])
            assert result.success and result.reward == 10.0
            assert steps == rooms + (1 if env.config.key_choices else 0)  # doors, the key, the chest
    assert make_env(load_config("recipes/testbed.yaml").env).config.horizon == 4  # the recipe builds it


@pytest.mark.parametrize("split", ["train", "l0", "l1", "l2"])
def test_each_knob_sets_what_it_says_on_every_split(split):
    """What each knob sets, read from the corridors and what the agent is shown, split by split
    (an expert solves a corridor whatever its knobs did)."""
    env = testbed.TestbedEnv(horizon=6, doors=3, hint_rate=0.3, distractors=2, key_choices=3, delay=2, slack=5,
                             l2_extra_rooms=3)
    rooms = 6 + (3 if split == "l2" else 0)
    hinted = []
    for task_id in env.split_tasks(split)[:100]:
        obs = env.reset(task_id)
        corridor = env.corridor
        assert len(corridor.rooms) == rooms and env.task_type(task_id) == f"corridor_{rooms}"
        assert corridor.key_room == rooms - 1 - 2  # `delay` rooms between the key's room and the chest's
        assert len(corridor.keys) == 3 and corridor.goal in corridor.keys
        assert env.limit == rooms + 5 + 1 and env.max_steps == 6 + 3 + 5 + 1  # the pool's bound: L2's limit
        for room, (doors, way, hint, objects) in enumerate(corridor.rooms):
            assert len(set(doors)) == 3 and way in doors and len(set(objects)) == 2
            assert env.room == room and obs.text.startswith(f"You are in room {room + 1}.")
            assert ("go back" in obs.admissible_actions) == (room > 0)  # no way back from the first room
            assert (f"You carry the {corridor.goal} key." in obs.text) == (room > corridor.key_room)
            shown = [a for a in obs.admissible_actions if a.startswith(("go through", "examine", "take"))]
            last = room == rooms - 1
            assert len(shown) == (0 if last else 3) + 2 + (3 if room == corridor.key_room else 0)
            assert ("draft" in obs.text) == (hint and not last) and ("Keys lie" in obs.text) == (room == corridor.key_room)
            if room == corridor.key_room:  # every key on offer is named
                assert f"Keys lie on the floor: {', '.join(corridor.keys)}." in obs.text
            hinted.append(hint)
            action = env.expert_action()[1]
            if action.startswith("take"):
                obs = env.step(action).observation
                action = env.expert_action()[1]
            obs = env.step(action).observation
    assert 0.2 < sum(hinted) / len(hinted) < 0.4


def test_a_tasks_demonstration_is_the_same_in_every_run():
    """The noisy demonstrator's choices derive from the task id: another instance, playing the
    tasks in another order, demonstrates the same moves."""
    def demonstration(env, task_id):
        env.reset(task_id)
        moves, result = [], None
        while result is None or not result.done:
            moves.append(env.expert_action()[1])
            result = env.step(moves[-1])
        return moves, result.success

    first, second = (testbed.TestbedEnv(key_choices=4, expert_key_noise=0.5) for _ in range(2))
    tasks = first.split_tasks("train")[:60]
    played = [demonstration(first, t) for t in tasks]
    assert played == [demonstration(second, t) for t in reversed(tasks)][::-1]
    assert 8 <= sum(not success for _, success in played) <= 40  # a wrong key: half x 3 in 4 of the tasks


def test_splits_are_unseen_compositions():
    env = testbed.TestbedEnv(horizon=3, l2_extra_rooms=2)
    goals = {split: {env.reset(t).task.split(" the ")[-1].split()[0] for t in env.split_tasks(split)}
             for split in ("train", "l0", "l1", "l2")}
    assert goals["train"] == goals["l0"] == set(SEEN_GOALS)
    assert goals["l1"] == goals["l2"] == set(HELD_OUT_GOALS)
    assert {env.task_type(t) for t in env.split_tasks("l0")} == {"corridor_3"}
    assert {env.task_type(t) for t in env.split_tasks("l2")} == {"corridor_5"}
    assert env.reset("l1-7").text == testbed.TestbedEnv(horizon=3, l2_extra_rooms=2).reset("l1-7").text  # same world anywhere
    with pytest.raises(ValueError, match="bad testbed task id"):
        env.reset("test-1")
    with pytest.raises(ValueError, match="unknown split 'test'"):
        env.split_tasks("test")


def test_distractors_and_dead_ends_revisit_the_same_state():
    env = testbed.TestbedEnv(horizon=3, distractors=2, hint_rate=1.0, delay=0)  # the key in the last room
    obs = env.reset("train-3")
    examine = [a for a in obs.admissible_actions if a.startswith("examine")]
    assert len(examine) == 2
    after = env.step(examine[0])
    assert after.observation.anchor == obs.anchor and after.progress is False and after.reward == 0
    way = env.expert_action()[1]
    wrong = next(a for a in obs.admissible_actions if a.startswith("go through") and a != way)
    assert env.step(wrong).observation.text == "A dead end. The only way is back."
    assert env.step("go back").observation.anchor == obs.anchor  # exactly the state left
    assert env.step(way).progress is True


def test_the_expert_turns_back_for_a_key_left_behind():
    """Walked past the key's room without the key (DAgger's rounds visit such states), the expert
    goes back to it and takes the key of the task's chest."""
    env = testbed.TestbedEnv(horizon=5, delay=2, hint_rate=1.0)
    env.reset("train-1")
    corridor = env.corridor
    while env.room < len(corridor.rooms) - 1:  # straight on, past the keys
        env.step(f"go through {corridor.rooms[env.room][1]} door")
    moves = []
    while len(moves) < 10 and not (moves and moves[-1].startswith("take")):
        moves.append(env.expert_action()[1])
        env.step(moves[-1])
    assert moves == ["go back"] * (len(corridor.rooms) - 1 - corridor.key_room) + [f"take {corridor.goal} key"]


def test_hint_rate_hides_the_way_on():
    hinted = testbed.TestbedEnv(hint_rate=1.0).reset("train-0").text
    hidden = testbed.TestbedEnv(hint_rate=0.0).reset("train-0").text
    assert "draft" in hinted and "draft" not in hidden


def test_a_wrong_key_is_decisive_and_fails_only_at_the_chest():
    env = testbed.TestbedEnv(horizon=5, delay=3, key_choices=3, slack=20)
    env.reset("train-2")
    goal = env.corridor.goal
    steps = 0
    while not any(a.startswith("take") for a in env.admissible_actions()):
        env.step(env.expert_action()[1])
        steps += 1
    assert env.room == env.corridor.key_room == 5 - 1 - 3
    assert "Keys lie on the floor" in env._observation().text
    wrong = next(a for a in env.admissible_actions() if a.startswith("take") and goal not in a)
    text = env.step(wrong).observation.text
    assert not any(a.startswith("take") for a in env.admissible_actions())  # irreversible
    assert f"You carry the {wrong.split()[1]} key." in text and "Keys lie" not in text  # the keys left not offered
    with pytest.raises(Exception, match="wrong key"):
        env.expert_action()
    for _ in range(3):  # the delay: three more rooms before the consequence shows
        result = env.step(f"go through {env.corridor.rooms[env.room][1]} door")
        assert not result.done and result.reward == 0
    result = env.step("open chest")
    assert result.done and not result.success and result.reward == 0

    env.reset("train-2")  # the chest tried with no key at all: nothing happens, the task goes on
    while env.room < len(env.corridor.rooms) - 1:
        env.step(f"go through {env.corridor.rooms[env.room][1]} door")
    result = env.step("open chest")
    assert env.key is None and not result.done and not result.success and result.reward == 0


def test_the_step_limit_is_horizon_plus_slack():
    env = testbed.TestbedEnv(horizon=4, slack=3, distractors=1)
    examine = lambda obs: next(a for a in obs.admissible_actions if a.startswith("examine"))  # noqa: E731
    result, steps = play(env, "train-0", examine)
    assert steps == 4 + 3 + 1 and not result.success


def test_an_action_not_admissible_changes_nothing():
    """Any action off the admissible list, in any state along the way, a dead end included, costs a
    step and changes nothing: no door passed, no key taken, no chest tried."""
    env = testbed.TestbedEnv(horizon=4, doors=3, key_choices=3, delay=1, slack=500)
    candidates = ([f"go through {c} door" for c in COLOURS] + [f"take {c} key" for c in COLOURS]
                  + [f"examine {o}" for o in OBJECTS] + ["open chest", "go back", "look"])
    tried = 0
    for task_id in env.split_tasks("train")[:10]:
        env.reset(task_id)
        doors, way, _, _ = env.corridor.rooms[0]
        env.step(f"go through {next(d for d in doors if d != way)} door")  # a dead end first
        result = None
        while result is None or not result.done:
            state, text = (env.room, env.dead_end, env.key), env._observation().text
            for action in candidates:
                if action not in env.admissible_actions():
                    after = env.step(action)
                    assert (env.room, env.dead_end, env.key) == state and after.observation.text == text, action
                    assert not after.done and after.reward == 0 and after.info["admissible"] is False
                    tried += 1
            result = env.step(env.expert_action()[1])
        assert result.success
    assert tried > 500


def test_random_play_is_well_formed():
    env, rng = testbed.TestbedEnv(horizon=4, doors=3, hint_rate=0.5, key_choices=3), random.Random(0)
    for i in range(50):
        obs = env.reset(f"train-{i}")
        done = False
        while not done:
            assert obs.admissible_actions and obs.anchor == obs.text
            result = env.step(rng.choice(obs.admissible_actions + [None]))
            obs, done = result.observation, result.done
    assert testbed.TestbedConfig().type == "testbed"


def test_a_random_key_demonstrator_is_imitated_mistakes_included(tmp_path):
    """`expert_key_noise: 1`: the demonstrations take each key about equally often and reach the
    chest either way; its failed episodes reach the SFT data only with `sft.keep_failed`. At 0.5,
    half the tasks' demonstrations are the expert's."""
    import json
    from collections import Counter

    from agentrl.config import PromptConfig
    from agentrl.data import collect_expert_data
    from agentrl.prompting import parse_action

    env = testbed.TestbedEnv(key_choices=4, expert_key_noise=1.0)
    outcomes = Counter()
    for task_id in env.split_tasks("train")[:200]:
        result, steps = play(env, task_id, lambda obs: env.expert_action()[1])
        outcomes[result.success] += 1
        assert steps == 4 + 1 and result.done  # the shortest way to the chest, with whichever key
    assert 30 <= outcomes[True] <= 70  # 1 in 4 fits

    prompt = PromptConfig(template="{task} {observation} {actions}", history_length=0)
    taken = {}
    for keep in (False, True):
        path = tmp_path / f"keep{keep}.jsonl"
        stats = collect_expert_data(env, prompt, 100, path, 0, keep_failed=keep)
        takes = [json.loads(line)["messages"] for line in path.read_text().splitlines()]
        takes = [(m[0]["content"], parse_action(m[1]["content"])) for m in takes
                 if parse_action(m[1]["content"]).startswith("take")]
        taken[keep] = Counter(f"the {action.split()[1]} chest" in user for user, action in takes)
        # every kept episode takes one key; the expert won those whose key fits
        assert stats["kept"] == len(takes) and stats["successful"] == taken[keep][True]
    assert taken[False][False] == 0 and 15 <= taken[False][True] <= 40  # successes: the fitting key
    assert 50 <= taken[True][False] <= 90 and taken[True][True] == taken[False][True]
    goal = testbed.TestbedEnv(key_choices=4)
    for task_id in goal.split_tasks("train")[:50]:
        assert play(goal, task_id, lambda obs: goal.expert_action()[1])[0].success
    half = testbed.TestbedEnv(key_choices=4, expert_key_noise=0.5)
    wins = sum(play(half, t, lambda obs: half.expert_action()[1])[0].success for t in half.split_tasks("train")[:400])
    assert 0.5 + 0.5 / 4 - 0.08 < wins / 400 < 0.5 + 0.5 / 4 + 0.08


def test_split_sizes_and_eval_corridors_apart_from_training():
    """train_size and eval_size set the splits' sizes, and an L0 task is a corridor of its own, not
    the training task of the same number."""
    env = testbed.TestbedEnv(train_size=40, eval_size=12)
    assert {s: len(env.split_tasks(s)) for s in ("train", "l0", "l1", "l2")} == {"train": 40, "l0": 12, "l1": 12, "l2": 12}
    same = sum(make_corridor(env.config, f"l0-{i}") == make_corridor(env.config, f"train-{i}")
               for i in range(12))
    assert same <= 1


def test_the_way_on_is_any_door_and_progress_is_the_fitting_keys_way():
    """The door that leads on is drawn among the room's doors (no position gives it away), and a
    step's progress flag is the shortest way with the key that fits, also where the noisy
    demonstrator took another."""
    env = testbed.TestbedEnv(doors=3)
    positions = [doors.index(way) for t in env.split_tasks("train")[:100]
                 for doors, way, _, _ in make_corridor(env.config, t).rooms]
    assert all(positions.count(k) > len(positions) / 5 for k in range(3))
    keyed = testbed.TestbedEnv(key_choices=3)
    listed = [c.keys.index(c.goal) for c in (make_corridor(keyed.config, t) for t in keyed.split_tasks("train")[:100])]
    assert all(listed.count(k) > len(listed) / 5 for k in range(3))  # nor does the fitting key's place

    noisy = testbed.TestbedEnv(key_choices=4, expert_key_noise=1.0)
    judged = 0
    for task_id in noisy.split_tasks("train")[:40]:
        noisy.reset(task_id)
        while not any(a.startswith("take") for a in noisy.admissible_actions()):
            noisy.step(noisy.expert_action()[1])
        demonstrated = noisy.expert_action()[1]
        if demonstrated != f"take {noisy.corridor.goal} key":
            judged += 1
            noisy.reset(task_id)
            while not any(a.startswith("take") for a in noisy.admissible_actions()):
                noisy.step(noisy.expert_action()[1])
            assert noisy.step(demonstrated).progress is not True  # a key that does not fit
    assert judged >= 20
