"""ALFWorld game data: find or unpack the game set, list splits, build a game's `game.tw-pddl`.

Two sources work: the official `alfworld-download` layout (a folder holding `json_2.1.1/`), and
the slim archive (`alfworld_json_2.1.1_slim.tar.xz`, `initial_state.pddl` + `traj_data.json` per
game), which is unpacked once into the cache. A game's `game.tw-pddl` is built the way
`alfworld-generate` builds it (the package's own `alfred.pddl` and `alfred.twl2`, the task text
put into the grammar by `add_task_to_grammar`), marked solvable, and written on first use: the
slim set holds only solvable games, and writing all 4,026 up front would cost ~600 MB.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import tarfile
import tempfile
from pathlib import Path

from agentrl.config import ConfigError

TASK_TYPES = ("pick_and_place_simple", "look_at_obj_in_light", "pick_clean_then_place_in_recep",
              "pick_heat_then_place_in_recep", "pick_cool_then_place_in_recep", "pick_two_obj_and_place")
L2_TYPES = ("pick_cool_then_place_in_recep", "pick_two_obj_and_place")
"""The out-of-domain split: these types of valid_unseen, trained on the four others."""
SPLIT_DIRS = {"train": "train", "l0": "valid_seen", "l1": "valid_unseen", "l2": "valid_unseen"}


def cache_dir() -> Path:
    return Path(os.environ.get("AGENTRL_CACHE", Path.home() / ".cache" / "agentrl"))


def resolve_data(data: str | None) -> Path:
    """The folder that holds `json_2.1.1/`: `data` (a folder or the slim archive), else
    $ALFWORLD_DATA. An archive is unpacked into the cache once (atomically: a crash mid-way
    leaves no half-unpacked folder behind)."""
    source = data or os.environ.get("ALFWORLD_DATA")
    if not source:
        raise ConfigError("env.data: ALFWorld data not configured: set env.data to the game folder or the slim "
                         "archive (alfworld_json_2.1.1_slim.tar.xz), or the ALFWORLD_DATA variable")
    path = Path(source).expanduser()
    if path.is_dir():
        if not (path / "json_2.1.1").is_dir():
            raise ConfigError(f"env.data: {path} holds no json_2.1.1/ folder (the alfworld-download layout)")
        return path
    if not path.is_file():
        raise ConfigError(f"env.data: ALFWorld data {path} does not exist")
    target = cache_dir() / "alfworld" / path.name.split(".")[0]
    if (target / "json_2.1.1").is_dir():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=target.parent, prefix=".unpack-"))
    try:
        with tarfile.open(path) as archive:
            archive.extractall(staging, filter="data")
        if not (staging / "json_2.1.1").is_dir():
            raise ConfigError(f"env.data: {path}: the archive holds no json_2.1.1/ folder")
        staging.rename(target)
    except (tarfile.TarError, EOFError, OSError) as err:
        raise ConfigError(f"env.data: {path}: cannot unpack the ALFWorld archive ({err})") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def list_games(root: Path, split: str, task_types: tuple[str, ...] = TASK_TYPES) -> list[str]:
    """Game ids ("valid_unseen/<task folder>/<trial>") of a split, sorted. The task type is the
    task folder's prefix (as in traj_data.json's task_type)."""
    base = root / "json_2.1.1" / SPLIT_DIRS[split]
    if not base.is_dir():
        raise ValueError(f"ALFWorld split folder {base} does not exist")
    types = L2_TYPES if split == "l2" else task_types
    games = []
    for task in sorted(os.scandir(base), key=lambda e: e.name):
        if task.is_dir() and task_type(task.name) in types:
            games += [f"{SPLIT_DIRS[split]}/{task.name}/{trial.name}"
                      for trial in sorted(os.scandir(task.path), key=lambda e: e.name) if trial.is_dir()]
    return games


def eval_order(games: list[str]) -> list[str]:
    """A fixed shuffle, so that the first N games of an evaluation split mix the task types."""
    games = list(games)
    random.Random(0).shuffle(games)
    return games


def task_type(game_id: str) -> str:
    name = game_id.split("/")[1] if "/" in game_id else game_id
    kind = name.split("-", 1)[0]
    if kind not in TASK_TYPES:
        raise ValueError(f"{game_id}: unknown ALFWorld task type {kind!r}")
    return kind


def game_params(root: Path, game_id: str) -> dict:
    """The game's `pddl_params` (object_target, parent_target, toggle_target, ...)."""
    return json.loads((root / "json_2.1.1" / game_id / "traj_data.json").read_text())["pddl_params"]


def game_file(root: Path, game_id: str) -> Path:
    """The game's `game.tw-pddl`, built from its PDDL problem and trajectory data if missing."""
    folder = root / "json_2.1.1" / game_id
    path = folder / "game.tw-pddl"
    if path.is_file():
        return path
    import alfworld
    from alfworld.agents.utils.misc import add_task_to_grammar

    logic = Path(alfworld.__file__).parent / "data"
    problem, traj_path = folder / "initial_state.pddl", folder / "traj_data.json"
    for needed in (problem, traj_path):
        if not needed.is_file():
            raise ValueError(f"ALFWorld game {game_id}: missing {needed}")
    try:
        traj = json.loads(traj_path.read_text())
        grammar = add_task_to_grammar((logic / "alfred.twl2").read_text(), traj)
    except (json.JSONDecodeError, KeyError, TypeError) as err:
        raise ValueError(f"ALFWorld game {game_id}: corrupt {traj_path} ({err!r})") from None
    game = {"pddl_domain": (logic / "alfred.pddl").read_text(), "grammar": grammar,
            "pddl_problem": problem.read_text(), "solvable": True, "walkthrough": None}
    staging = path.with_suffix(f".tmp{os.getpid()}")  # workers may build the same game at once
    staging.write_text(json.dumps(game))
    staging.replace(path)
    return path
