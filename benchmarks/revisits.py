"""How an agent moves, from kept evaluation trajectories: per split, the episodes, the share won,
moves per episode, and three shares of moves: the previous move again (the evaluation's
`repeated_rate`), any earlier move of the episode again, and, of the `go to` moves, those to a
place the episode has already gone to; and the share of episodes that take an object of another
type than the task names (read from an ALFWorld task id, `<type>-<Object>-...`). For all
episodes, then the won and the lost apart (a lost episode runs to the step limit, so an agent that
loses more revisits more overall even where it moves as the other does within each outcome).
A second table, over every split's episodes together: of the `take` moves, the share that take an
object of another type, for the first take of an episode and by move number (whether an agent
loses the task as its episode grows, or never reads it). Reads the files the archives keep; no
model, no engine.

    python benchmarks/revisits.py full=benchmarks/results/alfworld-full/full/seed0/rl/eval/step_000015 \
        notebook-sft=benchmarks/results/alfworld-seeds/grpo/seed0/eval/sft
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def task_object(task_id: str) -> str | None:
    """The object an ALFWorld task names (`valid_seen/pick_and_place_simple-Candle-None-Toilet-429/...`
    gives `candle`), or None for another kind of id."""
    parts = task_id.split("/")[1].split("-") if task_id.count("/") >= 1 else []
    return parts[1].lower() if len(parts) >= 5 else None


Episode = tuple[bool, str | None, list[str]]  # won, the object the task names, the moves


def read(path: Path) -> list[Episode]:
    episodes = []
    for line in path.open():
        episode = json.loads(line)
        actions = [s["action"] for s in episode["steps"] if s["action"] is not None]
        episodes.append((bool(episode["success"]), task_object(episode["task_id"]), actions))
    return episodes


def takes(target: str | None, actions: list[str]) -> list[tuple[int, bool]]:
    """(move number from 1, whether it takes an object of another type) for each `take` move of an
    episode whose task names an object."""
    if target is None:
        return []
    return [(i, a.split(" ")[1] != target) for i, a in enumerate(actions, 1) if a.startswith("take ")]


def move_stats(episodes: list[Episode], outcome: bool | None = None) -> dict[str, float]:
    """Over the episodes whose success is `outcome` (None: all)."""
    n = won = moves = previous = earlier = gos = revisits = wrong_takes = 0
    for success, target, actions in episodes:
        if outcome is not None and success != outcome:
            continue
        n += 1
        won += success
        moves += len(actions)
        previous += sum(a == b for a, b in zip(actions, actions[1:]))
        earlier += sum(a in actions[:i] for i, a in enumerate(actions))
        places = [a for a in actions if a.startswith("go to ")]
        gos += len(places)
        revisits += sum(a in places[:i] for i, a in enumerate(places))
        wrong_takes += any(wrong for _, wrong in takes(target, actions))
    return {"episodes": n, "won": won / max(n, 1), "moves": moves / max(n, 1),
            "previous": previous / max(moves, 1), "earlier": earlier / max(moves, 1),
            "revisits": revisits / max(gos, 1), "wrong_takes": wrong_takes / max(n, 1)}


MOVE_BINS = ((1, 3), (4, 6), (7, 10), (11, 20), (21, 30))


def take_stats(episodes: list[Episode]) -> dict[str, tuple[int, int]]:
    """(takes of another type than the task names, takes) for each episode's first take and for
    the takes at each range of move numbers of `MOVE_BINS`."""
    counts = {"first": [0, 0], **{f"{a}-{b}": [0, 0] for a, b in MOVE_BINS}}
    for _, target, actions in episodes:
        episode_takes = takes(target, actions)
        if not episode_takes:
            continue
        counts["first"][0] += episode_takes[0][1]
        counts["first"][1] += 1
        for move, wrong in episode_takes:
            key = next(f"{a}-{b}" for a, b in MOVE_BINS if a <= move <= b)
            counts[key][0] += wrong
            counts[key][1] += 1
    return {key: (wrong, n) for key, (wrong, n) in counts.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", help="NAME=DIR, DIR holding trajectories_<split>.jsonl")
    args = parser.parse_args()
    print("| run | split | episodes | won | moves / episode | previous move again | an earlier move again "
          "| go-to revisits | episodes taking another object |")
    print("|---|---|---|---|---|---|---|---|---|")
    outcomes = {"all": None, "won": True, "lost": False}
    runs = {}
    for spec in args.runs:
        name, _, folder = spec.partition("=")
        runs[name] = {path.stem.removeprefix("trajectories_"): read(path)
                      for path in sorted(Path(folder).glob("trajectories_*.jsonl"))}
        for split, episodes in runs[name].items():
            for label, outcome in outcomes.items():
                s = move_stats(episodes, outcome)
                print(f"| {name} | {split} {label} | {s['episodes']} | {s['won']:.1%} | {s['moves']:.1f} "
                      f"| {s['previous']:.1%} | {s['earlier']:.1%} | {s['revisits']:.1%} | {s['wrong_takes']:.1%} |")
    print("\nTakes of an object of another type than the task names, every split: share (takes)\n")
    print("| run | an episode's first take | " + " | ".join(f"moves {a}-{b}" for a, b in MOVE_BINS) + " |")
    print("|---" * (len(MOVE_BINS) + 2) + "|")
    for name, splits in runs.items():
        every = [episode for episodes in splits.values() for episode in episodes]
        cells = [f"{wrong / n:.0%} ({n})" if n else "- (0)" for wrong, n in take_stats(every).values()]
        print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
