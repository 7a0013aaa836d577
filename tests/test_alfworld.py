"""The real ALFWorld engine (TextWorld) on the shared slim game set."""

import random

import pytest

from agentrl.envs.alfworld import AlfWorldEnv, speedups
from agentrl.envs.alfworld.env import group_actions
from agentrl.envs.alfworld.games import L2_TYPES, TASK_TYPES, game_file, resolve_data, task_type


@pytest.fixture(scope="module")
def env(alfworld_data):
    env = AlfWorldEnv(data=alfworld_data)
    yield env
    env.close()


def play_expert(env, game):
    env.reset(game)
    for _ in range(env.max_steps):
        result = env.step(env.expert_action()[1])
        if result.done:
            return result.success
    return False


def test_splits_have_the_documented_sizes_and_do_not_overlap(env, alfworld_data):
    sizes = {split: len(env.split_tasks(split)) for split in ("train", "l0", "l1", "l2")}
    assert sizes == {"train": 3553, "l0": 140, "l1": 134, "l2": 38}
    train, l0, l1, l2 = (set(env.split_tasks(s)) for s in ("train", "l0", "l1", "l2"))
    assert not train & l0 and not train & l1 and not l0 & l1 and l2 <= l1
    assert {task_type(g) for g in l2} == set(L2_TYPES)
    four = AlfWorldEnv(data=alfworld_data, train_task_types=[t for t in TASK_TYPES if t not in L2_TYPES])
    assert {task_type(g) for g in four.split_tasks("train")} == set(TASK_TYPES) - set(L2_TYPES)
    # evaluation takes each split's first N games: a fixed order, the same in every process, mixed
    assert all(four.split_tasks(s) == env.split_tasks(s) for s in ("l0", "l1", "l2"))
    four.close()
    first = env.split_tasks("l0")[:12]
    assert first != sorted(first) and len({task_type(g) for g in first}) >= 4


def test_planner_expert_solves_unseen_games(env):
    games = random.Random(0).sample(env.split_tasks("l1"), 5)
    solved = sum(play_expert(env, g) for g in games)
    assert solved >= 0.95 * len(games), f"planner solved {solved}/{len(games)}"


def play_mixed(env, games, steps=10):
    """Expert moves and random admissible moves in turn (the random ones make the expert replan);
    everything the agent and the expert see."""
    rng, seen = random.Random(0), []
    for game in games:
        obs = env.reset(game)
        seen.append((obs.text, obs.task, obs.admissible_actions))
        for step in range(steps):
            action = env.expert_action()[1] if step % 2 else rng.choice(obs.admissible_actions)
            result = env.step(action)
            obs = result.observation
            seen.append((action, obs.text, obs.admissible_actions, result.reward, result.done))
            if result.done:
                break
    return seen


def test_memoised_engine_plays_exactly_as_textworld_does(env):
    types = ("pick_clean_then_place_in_recep", "pick_two_obj_and_place", "look_at_obj_in_light",
             "pick_and_place_simple", "pick_and_place_simple")  # its second play reuses the cached translation
    games = [next(g for g in env.split_tasks("l0") if task_type(g) == t) for t in types]
    fast = play_mixed(env, games)
    speedups.uninstall()
    try:
        slow = play_mixed(env, games)
    finally:
        speedups.install()
    assert len(fast) > 40 and fast == slow



def test_the_engine_parses_and_translates_each_text_once(env):
    """What the speedups cache is not computed again: a game played again translates nothing to
    SAS and parses none of its texts; uninstalled and installed again, the caches are back."""
    from textworld.envs.pddl import textgen

    game = env.split_tasks("l0")[3]

    def play():
        env.reset(game)
        for action in ("look", "inventory"):
            env.step(action)
    play()
    calls, originals = [], dict(speedups._ORIGINALS)

    def counted(name):
        def call(*args, **kwargs):
            calls.append(name)
            return originals[name](*args, **kwargs)
        return call
    speedups._ORIGINALS.update(pddl2sas=counted("pddl2sas"), textgen=counted("textgen"))
    try:
        play()
    finally:
        speedups._ORIGINALS.update(originals)
    assert calls == []
    speedups.uninstall()
    assert textgen._parse_and_convert is originals["textgen"]
    speedups.install()
    assert textgen._parse_and_convert is not originals["textgen"]


def test_observation_prompt_fields_and_invalid_step(env):
    obs = env.reset(env.split_tasks("l0")[0])
    assert obs.task and not obs.text.startswith("-=") and "Your task is to" not in obs.text
    assert "help" not in obs.admissible_actions and obs.anchor == obs.text
    result = env.step(None)
    assert result.observation.text == "Nothing happens." and not result.done
    assert result.reward == 0 and result.info["admissible"] is False and result.progress is False
    result = env.step("look")
    assert result.progress is False  # never progress
    there = next(a for a in result.observation.admissible_actions if a.startswith("go to "))
    result = env.step(there)
    examine = next(a for a in result.observation.admissible_actions if a.startswith("examine "))
    assert env.step(examine).progress is False  # examining changes nothing either
    env.reset(env.split_tasks("l0")[1])
    for _ in range(3):  # the planner's moves, followed: labelled good
        assert env.step(env.expert_action()[1]).progress is True


def test_success_pays_ten_and_ends_the_episode(env):
    game = env.split_tasks("l1")[3]
    env.reset(game)
    rewards = []
    while True:
        result = env.step(env.expert_action()[1])
        rewards.append(result.reward)
        if result.done:
            break
    assert result.success and rewards[-1] == 10.0 and sum(rewards) == 10.0


def test_the_step_limit_ends_an_episode_unwon_and_unpaid(alfworld_data):
    limited = AlfWorldEnv(data=alfworld_data, max_steps=3)
    limited.reset(limited.split_tasks("l0")[0])
    results = [limited.step("look") for _ in range(3)]
    limited.close()
    assert [r.done for r in results] == [False, False, True]
    assert not any(r.success for r in results) and [r.reward for r in results] == [0.0, 0.0, 0.0]


def test_missing_or_corrupt_game_names_the_file(alfworld_data, tmp_path, monkeypatch):
    monkeypatch.setenv("AGENTRL_CACHE", str(tmp_path / "cache"))
    with pytest.raises(ValueError, match="missing .*initial_state.pddl"):
        game_file(tmp_path, "valid_seen/pick_and_place_simple-X-None-Y-1/trial_1")
    game = tmp_path / "json_2.1.1" / "valid_seen" / "pick_and_place_simple-X-None-Y-1" / "trial_1"
    game.mkdir(parents=True)
    (game / "initial_state.pddl").write_text("(define)")
    (game / "traj_data.json").write_text("{not json")
    with pytest.raises(ValueError, match="corrupt .*traj_data.json"):
        game_file(tmp_path, "valid_seen/pick_and_place_simple-X-None-Y-1/trial_1")
    with pytest.raises(ValueError, match="does not exist"):
        resolve_data(str(tmp_path / "nowhere.tar.xz"))
    bad = tmp_path / "bad.tar.xz"
    bad.write_bytes(b"not an archive")
    with pytest.raises(ValueError, match="cannot unpack"):
        resolve_data(str(bad))



def test_an_archive_is_unpacked_once_and_one_without_the_game_folder_is_refused(tmp_path, monkeypatch):
    """The slim archive is unpacked into the cache on first use and found there after (what is
    in the cache folder is not replaced); an archive that holds no json_2.1.1/ folder is refused,
    naming it, and leaves nothing in the cache."""
    import tarfile

    from agentrl.config import ConfigError

    monkeypatch.setenv("AGENTRL_CACHE", str(tmp_path / "cache"))
    for name, top in (("games.tar.xz", "json_2.1.1"), ("other.tar.xz", "json_2.0")):
        folder = tmp_path / name.split(".")[0] / top / "valid_seen" / "pick_and_place_simple-X-None-Y-1" / "trial_1"
        folder.mkdir(parents=True)
        (folder / "traj_data.json").write_text("{}")
        with tarfile.open(tmp_path / name, "w:xz") as archive:
            archive.add(tmp_path / name.split(".")[0] / top, arcname=top)
    root = resolve_data(str(tmp_path / "games.tar.xz"))
    assert (root / "json_2.1.1" / "valid_seen").is_dir()
    (root / "json_2.1.1" / "kept.txt").write_text("written after unpacking")
    assert resolve_data(str(tmp_path / "games.tar.xz")) == root and (root / "json_2.1.1" / "kept.txt").is_file()
    with pytest.raises(ConfigError, match=r"other.tar.xz: the archive holds no json_2.1.1/ folder"):
        resolve_data(str(tmp_path / "other.tar.xz"))
    assert sorted(p.name for p in (tmp_path / "cache" / "alfworld").iterdir()) == ["games"]


def test_prepare_builds_the_game_file_of_every_train_l0_and_l1_game(env, alfworld_data, tmp_path):
    """`agentrl prepare` on ALFWorld (`AlfWorldEnv.prepare`): every game of the train, L0 and L1
    splits gets its game file (a set of two games per split, copied without them)."""
    import shutil
    from pathlib import Path

    games = [game for split in ("train", "l0", "l1") for game in env.split_tasks(split)[:2]]
    for game in games:
        source = Path(alfworld_data) / "json_2.1.1" / game
        (tmp_path / "json_2.1.1" / game).mkdir(parents=True)
        for name in ("initial_state.pddl", "traj_data.json"):
            shutil.copy(source / name, tmp_path / "json_2.1.1" / game / name)
    small = AlfWorldEnv(data=str(tmp_path))
    try:
        small.prepare()
    finally:
        small.close()
    assert all((tmp_path / "json_2.1.1" / game / "game.tw-pddl").is_file() for game in games)


def test_a_game_of_an_unknown_task_type_is_refused_by_name():
    assert task_type("valid_seen/pick_clean_then_place_in_recep-Mug-None-Cabinet-1/trial_1") == \
        "pick_clean_then_place_in_recep"
    with pytest.raises(ValueError, match=r"valid_seen/pick_and_eat-Apple-None-None-1/trial_1: unknown ALFWorld "
                                         r"task type 'pick_and_eat'"):
        task_type("valid_seen/pick_and_eat-Apple-None-None-1/trial_1")


def test_the_game_files_built_are_ones_alfworlds_own_loader_takes(env, alfworld_data, tmp_path):
    """ALFWorld's own environment (`AlfredTWEnv`) collects only the games whose game file says
    they are solvable: it takes every one this builds."""
    import shutil
    from pathlib import Path

    from alfworld.agents.environment.alfred_tw_env import TASK_TYPES as NUMBERED
    from alfworld.agents.environment.alfred_tw_env import AlfredTWEnv

    games, copy = env.split_tasks("l0")[:3], tmp_path / "games"
    for game in games:
        shutil.copytree(game_file(Path(alfworld_data), game).parent, copy / game)
    config = {"env": {"goal_desc_human_anns_prob": 0, "task_types": list(NUMBERED)},
              "dataset": {"eval_id_data_path": str(copy), "num_eval_games": -1}}
    taken = AlfredTWEnv(config, train_eval="eval_in_distribution").game_files
    assert sorted(Path(path).parent.relative_to(copy).as_posix() for path in taken) == sorted(games)


@pytest.fixture(scope="module")
def observer(alfworld_data):
    env = AlfWorldEnv(data=alfworld_data, max_steps=30, expert="observer", memory=True, grouped_actions=True)
    yield env
    env.close()


def test_observer_expert_solves_unseen_games_within_30_steps(observer):
    games = random.Random(1).sample(observer.split_tasks("l1"), 12)
    solved = sum(play_expert(observer, g) for g in games)
    assert solved >= 11, f"observer solved {solved}/{len(games)}"


def test_observer_searches_the_same_way_wherever_the_object_lies(observer):
    """Trials of one task in one room differ only in where things lie: the observer's moves are
    the same until it first sees the object (the planner walks straight to it: its first moves
    differ), and every object it takes was in sight before."""
    trials = [g for g in observer.split_tasks("train") if "/pick_and_place_simple-AlarmClock-None-Desk-318/" in g]
    searches = []
    for game in trials[:3]:
        obs, moves = observer.reset(game), []
        for _ in range(observer.max_steps):
            move = observer.expert_action()[1]
            if move.startswith("take "):
                assert move in obs.admissible_actions and move.split(" from ")[0][5:] in obs.memory
                break
            moves.append(move)
            obs = observer.step(move).observation
        searches.append(moves)
    shortest = min(len(m) for m in searches)
    assert shortest >= 1 and all(m[:shortest] == searches[0][:shortest] for m in searches)
    assert len({tuple(m) for m in searches}) > 1, "the trials should need searches of different lengths"


def test_notebook_records_what_the_episode_showed(observer):
    game = next(g for g in observer.split_tasks("l1") if "pick_clean_then_place" in g)
    obs = observer.reset(game)
    assert obs.actions_text == group_actions(obs.admissible_actions) and obs.actions_text.startswith("go to: ")
    assert obs.memory.startswith("At: the middle of the room. Not visited: ")
    receptacles = obs.memory.split("Not visited: ")[1].split(". Seen:")[0].split(", ")
    assert sorted(receptacles) == sorted(a[len("go to "):] for a in obs.admissible_actions if a.startswith("go to "))
    first = f"go to {receptacles[0]}"
    obs = observer.step(first).observation
    assert obs.memory.startswith(f"At: {receptacles[0]}.") and f" {receptacles[0]}," not in obs.memory.split("Seen:")[0]
    words = set(obs.task.lower().replace(".", "").split())
    for _ in range(observer.max_steps):
        move = observer.expert_action()[1]
        obs = observer.step(move).observation
        seen = obs.memory.split("Seen: ")[1].split(". Put: ")[0]
        assert seen == "nothing" or all(e.split(" in ")[0].rsplit(" ", 1)[0] in words for e in seen.split("; "))
        if move.startswith("take "):
            held = move[len("take "):].split(" from ")[0]
            assert obs.memory.endswith(f"Holding: {held}.")
            assert f"{held} in " not in obs.memory.split("Seen: ")[1]  # no longer where it was seen
        if move.startswith("clean "):
            assert obs.memory.endswith(f"Holding: {held} (cleaned).")
        if move.startswith("move "):  # the winning move: put, and no longer seen there
            where = move[len("move "):].split(" to ")[1]
            assert f"Put: {held} in {where}." in obs.memory and f"{held} in {where}" not in seen
            break
    else:
        pytest.fail("the observer did not win the game")
    assert observer.reset(game).memory.endswith("Holding: nothing.")
    plain = AlfWorldEnv(data=observer.root)
    assert plain.reset(game).memory is None and plain.reset(game).actions_text is None
    plain.close()


def test_notebook_knows_which_receptacles_are_closed(observer):
    observer.reset(next(g for g in observer.split_tasks("l1") if "pick_clean_then_place" in g))
    book = observer.notebook
    for receptacle in list(book.receptacles):
        if f"open {receptacle}" in observer.step(f"go to {receptacle}").observation.admissible_actions:
            break
    assert receptacle in book.closed
    observer.step(f"open {receptacle}")
    assert receptacle not in book.closed and receptacle in book.visited
    observer.step(f"close {receptacle}")
    assert receptacle in book.closed


def test_observer_searches_where_the_train_games_put_the_object_first(observer):
    """The search order is counted from the train split's initial states: pillows lie on beds
    and sofas, not in drawers; each search starts at the room's most likely receptacle kind."""
    from agentrl.envs.alfworld.observer import kind_of, search_order

    order = search_order(observer.root)
    assert set(order["pillow"][:2]) <= {"bed", "sofa", "armchair"} and "drawer" not in order["pillow"][:3]
    # ranked by the share of a kind's receptacles that hold the object, not by how many do: a room
    # has many drawers, which together hold most small things and each one seldom
    for small in ("cd", "keychain", "creditcard"):
        assert order[small].index("desk") < order[small].index("drawer"), small
    games = [g for g in observer.split_tasks("l0") if "pick_and_place_simple" in g][:4]
    for game in games:
        obs = observer.reset(game)
        target = game.split("/")[1].split("-")[1].lower()
        kinds = {a[len("go to "):].rsplit(" ", 1)[0] for a in obs.admissible_actions if a.startswith("go to ")}
        best = min(kinds, key=lambda k: order[target].index(k) if k in order[target] else len(order[target]))
        assert kind_of(observer.expert_action()[1][len("go to "):]) == best


def test_observer_searches_a_receptacle_that_shares_the_spot_from_there(observer):
    """Stoveburners 1 and 2 share a spot: from burner 1 the engine offers no `go to stoveburner 2`
    but the pot on it can be taken; the notebook counts burner 2 as searched."""
    game = "train/pick_clean_then_place_in_recep-Pot-None-StoveBurner-26/trial_T20190907_210713_391992"
    observer.reset(game)
    obs = observer.step("go to stoveburner 1").observation
    assert "go to stoveburner 2" not in obs.admissible_actions
    assert "stoveburner 2" not in obs.memory.split("Not visited: ")[1].split(". Seen:")[0]
    assert play_expert(observer, game)


def test_seen_objects_read_the_engines_lists():
    from agentrl.envs.alfworld.observer import seen_objects

    assert seen_objects("On the desk 1, you see a pen 2, a cd 1, and a mug 3.") == ["pen 2", "cd 1", "mug 3"]
    assert seen_objects("You open the drawer 1. The drawer 1 is open. In it, you see nothing.") == []
    assert seen_objects("Nothing happens.") == []


def test_grouped_actions_say_each_verb_once():
    actions = ["go to bed 1", "go to desk 1", "open drawer 1", "take pen 1 from desk 1", "examine desk 1", "look"]
    assert group_actions(actions) == "go to: bed 1, desk 1; open: drawer 1; examine: desk 1; take pen 1 from desk 1; look"


def test_rl_train_task_types_replace_the_envs_for_rl_only(alfworld_data, tiny_model_dir, tmp_path):
    """rl.train_task_types: RL's rollouts draw from those types (here "all": the types the env
    section left out too), while the env section, which the expert data and SFT read, keeps its own."""
    from pathlib import Path

    from agentrl.config import ConfigError
    from agentrl.recipe import validate_config
    from agentrl.trainer import RLTrainer

    def rl_train_types(rl_types):
        config = validate_config({
            "run_dir": str(tmp_path / str(rl_types)),
            "env": {"type": "alfworld", "data": alfworld_data, "train_task_types": ["pick_and_place_simple"]},
            "rl": {"steps": 1, "env_pool": {"workers": 0}, **({"train_task_types": rl_types} if rl_types else {})}})
        trainer = RLTrainer(config, str(tiny_model_dir), Path(config.run_dir))
        try:
            return {task_type(game) for game in trainer.pool.local.split_tasks("train")}, config.env.train_task_types
        finally:
            trainer.close()

    assert rl_train_types(None) == ({"pick_and_place_simple"}, ["pick_and_place_simple"])
    assert rl_train_types("all") == (set(TASK_TYPES), ["pick_and_place_simple"])
    assert rl_train_types(["look_at_obj_in_light"]) == ({"look_at_obj_in_light"}, ["pick_and_place_simple"])
    with pytest.raises(ConfigError, match="rl.train_task_types"):
        validate_config({"env": {"type": "household"}, "rl": {"train_task_types": "all"}})


def test_the_sampler_process_plays_rl_train_task_types(alfworld_data, tiny_model_dir, tmp_path):
    """With rl.overlap the sampler process has RL's environment pool: its episodes are of
    rl.train_task_types, not of the env section's."""
    from agentrl.models import load_model
    from agentrl.recipe import validate_config
    from agentrl.rollout.ahead import Ahead

    config = validate_config({
        "run_dir": str(tmp_path),
        "env": {"type": "alfworld", "data": alfworld_data, "max_steps": 1, "train_task_types": ["pick_and_place_simple"]},
        "rl": {"steps": 1, "tasks_per_step": 4, "group_size": 1, "env_pool": {"workers": 0},
               "overlap": {"staleness": 1}, "train_task_types": ["look_at_obj_in_light"]}})
    process = Ahead(config, str(tiny_model_dir))
    try:
        process.start(0, load_model(str(tiny_model_dir), "float32").named_parameters(), lambda step: "")
        trajectories, _ = process.take(1, {})
    finally:
        process.close()
    assert len(trajectories) == 4 and {t.task_type for t in trajectories} == {"look_at_obj_in_light"}


def test_the_notebook_reads_each_answer_of_the_engine():
    """The notebook from the engine's own phrasings, move by move: receptacles in number order, a
    move that did nothing changes nothing, a receptacle seen again lists only what is there now,
    and what the admissible actions offer to take is in sight (a shared spot's objects)."""
    from agentrl.envs.alfworld.observer import Notebook

    book = Notebook.start("put a mug in desk.", "You are in the middle of a room. Looking quickly around you, you see "
                          "a cabinet 10, a cabinet 2, a desk 1, a cabinet 1, and a stoveburner 1.")
    assert book.receptacles == ["cabinet 1", "cabinet 2", "cabinet 10", "desk 1", "stoveburner 1"]
    everywhere = [f"go to {r}" for r in book.receptacles]
    book.record("go to desk 1", "Nothing happens.", everywhere)
    assert book.location is None and not book.visited
    book.record("go to desk 1", "You arrive at desk 1. On the desk 1, you see a mug 1, and a pen 2.",
                everywhere + ["take mug 1 from desk 1", "take pen 2 from desk 1"])
    assert book.where == {"mug 1": "desk 1", "pen 2": "desk 1"}
    book.record("go to cabinet 1", "You arrive at cabinet 1. On the cabinet 1, you see nothing.", everywhere)
    book.record("go to desk 1", "You arrive at desk 1. On the desk 1, you see a pen 2.",
                everywhere + ["take pen 2 from desk 1"])
    assert book.where == {"pen 2": "desk 1"}  # the mug is gone from there
    book.record("go to stoveburner 1", "You arrive at stoveburner 1. On the stoveburner 1, you see nothing.",
                everywhere + ["take pot 1 from stoveburner 2"])
    assert book.where["pot 1"] == "stoveburner 2"


def test_the_observers_moves_from_a_notebook():
    """A pick-two's second object is not the one already put in the goal's receptacle (taking it
    back undoes the first half), and a receptacle that shares the agent's spot is opened from
    there (the engine offers no `go to` for it)."""
    from agentrl.envs.alfworld.observer import Goal, Notebook, observer_action

    two = Goal("pick_two_obj_and_place", "mug", "desk", "")
    book = Notebook("put two mug in desk.", ["desk 1", "shelf 1"], location="desk 1", visited={"desk 1", "shelf 1"},
                    where={"mug 3": "desk 1", "mug 2": "shelf 1", "mug 1": "desk 1"}, placed=[("mug 1", "desk 1")])
    admissible = ["go to shelf 1", "take mug 1 from desk 1", "take mug 3 from desk 1"]
    assert observer_action(book, two, admissible, {}) == "go to shelf 1"

    simple = Goal("pick_and_place_simple", "mug", "desk", "")
    book = Notebook("put a mug in desk.", ["cabinet 1", "countertop 1", "desk 1"], location="countertop 1",
                    visited={"countertop 1", "desk 1"})
    assert observer_action(book, simple, ["go to desk 1", "open cabinet 1"], {}) == "open cabinet 1"
    assert observer_action(book, simple, ["go to cabinet 1", "go to desk 1"], {}) == "go to cabinet 1"
