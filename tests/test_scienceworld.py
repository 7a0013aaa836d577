"""The real ScienceWorld engine (Java over py4j) with the RLVMR splits."""

import json
import random
import time
from pathlib import Path

import pytest

from agentrl.envs.scienceworld import ScienceWorldEnv
from agentrl.envs.scienceworld.env import ScienceWorldEnvConfig

from conftest import java_processes


@pytest.fixture(scope="module")
def env(scienceworld_splits):
    env = ScienceWorldEnv(splits_dir=scienceworld_splits, max_steps=200, valid_actions=True)
    yield env
    env.close()


def test_splits_have_the_documented_sizes(env, scienceworld_splits):
    assert len(env.split_tasks("train")) == 3322
    assert [len(env.split_tasks(s)) for s in ("l0", "l1", "l2")] == [1661, 1684, 549]
    train = set(env.split_tasks("train"))
    assert not train & set(env.split_tasks("l0")) and not train & set(env.split_tasks("l1"))
    l2 = ScienceWorldEnv(splits_dir=scienceworld_splits, train_split="l2")
    try:
        l2_train_types = {l2.task_type(t) for t in l2.split_tasks("train")}
        l2_test_types = {l2.task_type(t) for t in l2.split_tasks("l2")}
        assert len(l2.split_tasks("train")) == 2242 and len(l2_test_types) == 10
        assert not l2_train_types & l2_test_types  # held-out task types
        obs = l2.reset(l2.split_tasks("l2")[0])  # by default the valid actions are not listed
        assert obs.admissible_actions == [] and obs.info["objects"] and "objects: " in obs.actions_text
    finally:
        l2.close()


def test_a_split_prefix_covers_every_task_type(env, scienceworld_splits):
    """The split files list a type's variations together; the env lists the types in turn, so
    evaluation's first N variations of a split cover min(N, types) types."""
    for split, name in (("l0", "L0_idx.json"), ("l2", "L2_idx.json")):
        listed = env.split_tasks(split)
        pairs = json.loads((Path(scienceworld_splits) / name).read_text())["test"]
        assert sorted(listed) == sorted(f"{env.task_names[t]}/{v}" for t, v in pairs)  # the same variations
        types = {env.task_type(t) for t in listed}
        assert {env.task_type(t) for t in listed[:len(types)]} == types
        assert len({env.task_type(t) for t in listed[:5]}) == 5


def test_balanced_draws_train_every_task_type_equally_often(env, scienceworld_splits):
    """sample_tasks(by_type=True), what rl.balance_task_types draws: a type uniformly, then one of
    its variations; plain draws follow the train pool, where test-conductivity has 45x the
    variations of power-component."""
    from collections import Counter

    from agentrl.envs.base import sample_tasks

    pool = Counter(env.task_type(t) for t in env.split_tasks("train"))
    n = 100 * len(pool)
    plain = Counter(env.task_type(t) for t in sample_tasks(env, "train", n, random.Random(0)))
    balanced = sample_tasks(env, "train", n, random.Random(0), by_type=True)
    by_type = Counter(env.task_type(t) for t in balanced)
    assert set(by_type) == set(pool) and min(by_type.values()) > 60 and max(by_type.values()) < 140  # binomial(n, 1/types)
    assert max(pool.values()) > 20 * min(pool.values())  # the pool is lopsided,
    assert plain.most_common(1)[0][1] > 300  # and plain draws are too
    assert len(set(balanced)) > 10 * len(pool)  # variations of each type, not one per type


def test_train_task_types_and_resets_without_a_gold_path(env, scienceworld_splits):
    """`train_task_types` keeps those types in the train split only; `gold_path: false` skips the
    engine's gold-path simulation (minutes for inclined-plane tasks): the same first observation,
    no expert."""
    from agentrl.config import ConfigError
    from agentrl.envs.base import NoExpertMove

    kept = ["lifespan-longest-lived", "find-animal"]
    quick = ScienceWorldEnv(splits_dir=scienceworld_splits, gold_path=False, train_task_types=kept)
    try:
        train = quick.split_tasks("train")
        assert {quick.task_type(t) for t in train} == set(kept)
        assert len(train) == sum(env.task_type(t) in kept for t in env.split_tasks("train"))
        assert quick.split_tasks("l0") == env.split_tasks("l0")  # evaluation splits untouched
        task = train[0]
        assert quick.reset(task).text == env.reset(task).text
        with pytest.raises(NoExpertMove, match="gold_path"):
            quick.expert_action()
        start = time.perf_counter()
        quick.reset(next(t for t in quick.split_tasks("l0") if t.startswith("inclined-plane-determine-angle/")))
        assert time.perf_counter() - start < 10  # with its gold path: minutes
    finally:
        quick.close()
    wrong = ScienceWorldEnv(splits_dir=scienceworld_splits, train_task_types=["find-unicorn"])
    try:
        with pytest.raises(ConfigError, match=r"env.train_task_types: unknown ScienceWorld task\(s\) \['find-unicorn'\]"):
            wrong.split_tasks("train")
    finally:
        wrong.close()


def test_gold_paths_score_100_across_tasks(env):
    # ScienceWorld's gold paths are not perfectly reproducible (ambiguous object references are
    # resolved in a text order that varies): 57/58 over all 29 tasks when measured, so one miss
    # in this sample is tolerated; a broken reward, score or success rule fails every game.
    by_task = {}
    for task in env.split_tasks("l0"):
        by_task.setdefault(env.task_type(task), []).append(task)
    rng = random.Random(1)
    games = [rng.choice(by_task[task]) for task in rng.sample(sorted(by_task), 6)]
    solved = []
    for game in games:
        env.reset(game)
        total = 0.0
        for _ in range(env.max_steps):
            result = env.step(env.expert_action()[1])
            total += result.reward
            if result.done:
                break
        if result.success:
            assert result.info["score"] == 100 and total == 100, game
            solved.append(game)
    assert len(solved) >= len(games) - 1, f"gold paths solved {solved} of {games}"


def test_a_failed_task_costs_the_engine_s_100_points_or_with_the_penalty_off_the_points_held(env):
    """Focusing on a non-living thing fails find-living-thing: the engine scores -100 and the
    episode ends. By default the step is rewarded -100 less the 17 points the walk had earned (a
    return of -100); with `failure_penalty` off it takes back only those points (a return of 0,
    the score clipped at 0)."""
    for penalty, returned in ((True, -100.0), (False, 0.0)):
        env.failure_penalty = penalty
        try:
            env.reset("find-living-thing/202")
            rewards = [env.step(action).reward for action in ("teleport to kitchen", "look around")]
            result = env.step("focus on sink")
        finally:
            env.failure_penalty = True
        assert rewards == [17.0, 0.0], rewards
        assert result.done and not result.success and result.info["score"] == -100
        assert sum(rewards) + result.reward == returned, penalty


def test_the_penalty_changes_the_reward_not_the_expert_data(scienceworld_splits, tmp_path, capsys):
    """`env.failure_penalty` and `prompt.invalid_penalty` shape only the reward: expert data made
    with one setting is reused with another (so `make scienceworld-cpu` keeps its data, tokenizer
    and SFT model), while another `env` field still remakes the data."""
    import yaml

    from agentrl.cli import main

    recipe = tmp_path / "sw.yaml"
    recipe.write_text(yaml.safe_dump({
        "run_dir": str(tmp_path / "run"),
        "env": {"type": "scienceworld", "splits_dir": scienceworld_splits, "max_steps": 10,
                "train_task_types": ["lifespan-longest-lived"]},
        "prompt": {"template": "{task} {observation}", "history_length": 0}}))
    out = tmp_path / "expert.jsonl"
    data = ["data", str(recipe), "--out", str(out), "--episodes", "1"]
    assert main(data) == 0 and out.is_file()
    made = out.stat().st_mtime_ns
    assert main([*data, "--set", "env.failure_penalty=false", "--set", "prompt.invalid_penalty=0.5"]) == 0
    assert "done earlier with the same settings, reused" in capsys.readouterr().err and out.stat().st_mtime_ns == made
    assert main([*data, "--set", "env.failure_penalty=false", "--set", "env.max_steps=12"]) == 0
    assert "settings changed (env.max_steps: 10 -> 12), redoing" in capsys.readouterr().err


def test_the_notebook_keeps_the_rooms_and_the_moves_a_window_loses(env):
    """env.memory: the notebook follows the agent from room to room and keeps the moves that were
    carried out (not getting about or looking around), in order; what the engine did not
    understand is not a move."""
    env.memory = True
    try:
        first = env.reset("find-living-thing/202")
        assert "called the bathroom" in first.text
        assert first.memory == "In: bathroom. Been in: bathroom. Done: nothing yet."
        # Which animal the gold path picks varies between JVMs (the engine lists objects in
        # varying order); the way there does not.
        assert env.gold[:5] == ["open door to kitchen", "go to kitchen", "open door to outside", "go to outside",
                                "look around"]
        focus = env.gold[5]
        assert focus.startswith("focus on ")
        for action in [*env.gold[:6], "fly to the moon", "inventory"]:
            result = env.step(action)
        assert result.observation.memory == f"In: outside. Been in: bathroom, kitchen, outside. Done: {focus}."
        assert env.step("go to kitchen").observation.memory.startswith("In: kitchen. Been in: bathroom, kitchen, outside.")
        env.memory = False
        assert env.reset("find-living-thing/202").memory is None
    finally:
        env.memory = False


def test_the_teleporting_expert_goes_straight_where_the_gold_path_walks(env):
    """env.expert_teleports: each walk of the gold path (open door to X, go to X, repeated) is one
    teleport to where it ends; the rest is the gold path. On the engine the shorter path scores 100."""
    from agentrl.envs.scienceworld.env import teleported

    assert teleported(["open door to kitchen", "go to kitchen", "open door to outside", "go to outside", "look around",
                       "open door to greenhouse", "focus on bee", "open door to hallway", "go to hallway"]) == [
        "teleport to outside", "look around", "open door to greenhouse", "focus on bee", "teleport to hallway"]
    env.expert_teleports = True
    try:
        env.reset("find-living-thing/202")
        assert env.gold[:2] == ["teleport to outside", "look around"] and env.gold[2].startswith("focus on ")
        for steps in range(1, 20):
            result = env.step(env.expert_action()[1])
            if result.done:
                break
        assert result.success and steps == len(env.gold) < 14  # the gold path walks 14 steps
    finally:
        env.expert_teleports = False
    with pytest.raises(ValueError, match="env.expert_teleports"):
        ScienceWorldEnvConfig(simplification="", expert_teleports=True)


def test_a_move_the_engine_does_not_understand_is_rejected_and_changes_nothing(env):
    """try_step: the engine's parser answers before it acts, so a move it does not understand
    (or a reply with no action) is `Rejected` with nothing changed and no step counted. Tried
    between every move of a gold path, the path still scores 100 in its own number of steps and
    the expert stays on it. Without `reject_unparsed` the move is played."""
    env.reset("find-living-thing/202")
    assert env.try_step("fly to the moon").info["admissible"] is False and env.steps == 1  # by default: played
    env.reject_unparsed = True
    try:
        env.reset("find-living-thing/202")
        rejected_along_a_gold_path(env)
    finally:
        env.reject_unparsed = False


def rejected_along_a_gold_path(env):
    from agentrl.envs.base import Rejected
    from agentrl.envs.scienceworld.env import NOT_UNDERSTOOD

    for steps in range(1, 20):
        for nonsense in ("fly to the moon", None):
            rejected = env.try_step(nonsense)
            assert isinstance(rejected, Rejected) and rejected.feedback == NOT_UNDERSTOOD
        assert env.steps == steps - 1
        result = env.try_step(env.expert_action()[1])
        assert not isinstance(result, Rejected) and result.info["admissible"]
        if result.done:
            break
    assert result.success and result.info["score"] == 100 and steps == len(env.gold)


def test_retries_judged_by_the_engine_play_the_first_move_it_takes(scienceworld_splits, tiny_model_dir, tmp_path):
    """sampling.retries with an environment that judges moves itself: a move the engine rejects
    is sampled again in the same state (not trained on, not counted against the step limit),
    until one is taken or the retries are spent (then the last is played, understood or not).
    Lock-step and async play the same episode."""
    from agentrl.config import EnvPoolConfig, PromptConfig, SamplingConfig
    from agentrl.envs.pool import EnvPool
    from agentrl.models import load_tokenizer
    from agentrl.rollout.collect import collect
    from agentrl.rollout.records import read_trajectories, write_trajectories
    from agentrl.sampler.base import Generation

    tokenizer = load_tokenizer(tiny_model_dir)

    class Typist:
        """Answers every prompt with the next of `moves` (the sampler is not what is tested)."""

        def __init__(self, moves):
            self.moves = list(moves)

        def generate(self, prompts, params):
            texts = [f"<think>x</think><action>{self.moves.pop(0)}</action>" for _ in prompts]
            return [Generation(tokenizer(t, add_special_tokens=False).input_ids, [0.0] * 3) for t in texts]

    moves = ["fly to the moon", "look around", "pick up the sun", "dance", "inventory"]
    config = ScienceWorldEnvConfig(splits_dir=scienceworld_splits, max_steps=3, gold_path=False, reject_unparsed=True)
    prompt, sampling = PromptConfig(template="{task} {observation}", history_length=0), SamplingConfig(retries=1)
    with EnvPool(config, EnvPoolConfig(workers=1)) as pool:
        played = {mode: collect(pool, Typist(moves), tokenizer, ["find-living-thing/202"], 1, prompt, sampling,
                                mode=mode)[0] for mode in ("lockstep", "async")}
    for trajectory in played.values():
        assert [(s.action, s.rejected) for s in trajectory.steps] == [("look around", 1), ("dance", 1),
                                                                      ("inventory", 0)]
        assert [s.progress for s in trajectory.steps] == [None, False, None]  # "dance": played not understood
        assert not trajectory.aborted
    write_trajectories(tmp_path / "saved.jsonl", [played["async"]])
    assert [s.rejected for s in read_trajectories(tmp_path / "saved.jsonl")[0].steps] == [1, 1, 0]


def test_prompt_listing_stays_in_budget(env):
    obs = env.reset(env.split_tasks("l1")[0])
    assert len(obs.admissible_actions) > 50 and "reset task" not in obs.admissible_actions
    # Lists come out of the JVM joined in one call: the same as the engine's element by element.
    engine_list = [a for a in env._engine.get_valid_action_object_combinations() if a != "reset task"]
    assert obs.admissible_actions == engine_list
    assert obs.info["objects"] == list(env._engine.get_possible_objects())
    assert obs.actions_text.startswith("templates") and len(obs.actions_text) < 2500
    assert "focus on OBJ" in obs.actions_text and "ERROR" not in obs.actions_text
    assert "reset task" not in obs.actions_text  # the engine's own command, not a move
    result = env.step(None)
    assert not result.info["admissible"] and result.progress is False and not result.done
    result = env.step("fly to the moon")
    assert not result.info["admissible"]


def test_bad_split_file_and_task_id_are_named(tmp_path):
    pytest.importorskip("scienceworld")
    (tmp_path / "L0_idx.json").write_text(json.dumps({"train": [[99, 0]], "test": []}))
    env = ScienceWorldEnv(splits_dir=str(tmp_path))
    try:
        with pytest.raises(ValueError, match="task index 99 out of range"):
            env.split_tasks("train")
        with pytest.raises(ValueError, match="L1_idx.json does not exist"):
            env.split_tasks("l1")
        with pytest.raises(ValueError, match="unknown split 'l3'"):
            env.split_tasks("l3")
        with pytest.raises(ValueError, match="not '<task name>/<variation>'"):
            env.reset("boil-7")
    finally:
        env.close()


def test_no_jvm_left_after_close(scienceworld_splits):
    before = set(java_processes())
    env = ScienceWorldEnv(splits_dir=scienceworld_splits)
    started = set(java_processes()) - before
    assert len(started) == 1
    env.close()
    assert not set(java_processes()) & started


def test_the_notebook_keeps_the_last_moves_it_has_room_for():
    """The notebook's `keep` most recent moves, oldest first: a long episode's plan shows where it
    is now, not how it began."""
    from agentrl.envs.scienceworld.env import Notebook

    book = Notebook("kitchen", ["kitchen"], keep=3)
    for move in ["pick up thermometer", "open freezer", "move ice to pot", "activate stove", "wait1"]:
        book.record(move, "You do it.")
    assert book.text() == "In: kitchen. Been in: kitchen. Done: move ice to pot; activate stove; wait1."
    default = Notebook("kitchen", ["kitchen"])  # env.memory's notebook: the last 12 moves
    for n in range(14):
        default.record(f"wait{n}", "You do it.")
    assert default.text().endswith("Done: " + "; ".join(f"wait{n}" for n in range(2, 14)) + ".")


def test_a_teleport_is_an_arrival_and_only_a_walk_to_the_door_opened_becomes_one():
    """The notebook takes the engine's "You teleport to the X." as arriving in X, as it takes "You
    move to the X."; and the teleporting expert merges `open door to X` only with a `go to X` to the
    same place (a door opened and a walk elsewhere stay two moves)."""
    from agentrl.envs.scienceworld.env import Notebook, teleported

    book = Notebook("hallway", ["hallway"])
    book.record("teleport to kitchen", "You teleport to the kitchen.")
    book.record("go to workshop", "You move to the workshop.")
    book.record("open freezer", "The freezer is now open.")
    assert book.text() == "In: workshop. Been in: hallway, kitchen, workshop. Done: open freezer."
    walks = ["open door to kitchen", "go to hallway", "open door to greenhouse", "go to greenhouse"]
    assert teleported(walks) == ["open door to kitchen", "go to hallway", "teleport to greenhouse"]


def test_a_cut_objects_list_ends_at_a_whole_name(env):
    """Past `objects_budget` characters the prompt's objects list is cut after the last whole name
    that fits, and says so (every budget from 30 to 60 characters: most cut inside a name)."""
    text = env.reset("find-living-thing/202").text
    try:
        for budget in range(30, 61):
            env.objects_budget = budget
            obs = env._observation(text)
            listed = obs.actions_text.split("objects: ", 1)[1]
            assert listed.endswith(", ...") and len(listed) <= budget + len(", ..."), budget
            names = listed[:-len(", ...")].split(", ")
            assert names == obs.info["objects"][:len(names)] and len(names) < len(obs.info["objects"]), budget
    finally:
        env.objects_budget = 1500


def test_the_expert_has_no_move_once_the_agent_leaves_the_gold_path(env):
    """The expert follows the gold path only while the agent does: a move off it (understood, so
    its progress is unknown rather than none) leaves no expert move for the rest of the episode."""
    from agentrl.envs.base import NoExpertMove

    env.reset("find-living-thing/202")
    assert env.expert_action()[1] == env.gold[0] == "open door to kitchen"
    result = env.step("look around")
    assert result.info["admissible"] and result.progress is None
    with pytest.raises(NoExpertMove):
        env.expert_action()
    env.step(env.gold[0])  # back on the path's first move: still off it
    with pytest.raises(NoExpertMove):
        env.expert_action()
