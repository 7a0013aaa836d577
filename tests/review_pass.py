"""Reviewer's pass 28 (issue 45): single breakages written apart from the suite, each with the
verdict predicted before the run, back on features the issue names: ScienceWorld's splits and
engine answers, prefix trees, the shared-prefix decoder and its kept cache, and PPO's critic.
Run on a clone:
    PYTEST_ADDOPTS="-n 2" .venv/bin/python tests/review_pass.py --root ../pass
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mutants import MUTANTS, Mutant, run  # noqa: E402

SW = "src/agentrl/envs/scienceworld/env.py"
PACKING = "src/agentrl/packing.py"
DECODE = "src/agentrl/sampler/shared_decode.py"
CRITIC = "src/agentrl/critic.py"
SCIENCEWORLD = ["test_scienceworld.py", "test_pool.py"]
PACKED = ["test_packing.py", "test_trainer.py"]
DECODER = ["test_actor.py", "test_full_history.py"]
CRITICS = ["test_advantages.py", "test_trainer.py"]

# (mutant, predicted verdict)
PASS = [
    # ScienceWorld: splits and the engine's answers
    (Mutant("scienceworld: the evaluation splits play their train lists", SW,
            'pairs = read_split(self.splits_dir / name, "train" if split == "train" else "test")',
            'pairs = read_split(self.splits_dir / name, "train")', SCIENCEWORLD), "killed"),
    (Mutant("scienceworld: a split's task index past the engine's tasks not refused by name", SW,
            "if not 0 <= task < len(self.task_names):", "if not 0 <= task:", SCIENCEWORLD), "survived"),
    (Mutant("scienceworld notebook: a room come back to listed again", SW,
            "            if self.room not in self.visited:\n                self.visited.append(self.room)",
            "            if True:\n                self.visited.append(self.room)", SCIENCEWORLD), "survived"),
    (Mutant("scienceworld notebook: the first 12 moves kept, not the last", SW,
            "self.done = (self.done + [action])[-self.keep:]", "self.done = (self.done + [action])[:self.keep]",
            SCIENCEWORLD), "survived"),
    (Mutant("scienceworld: a failed task (score below 0) does not end the episode", SW,
            "done = success or engine_done or self.score < 0 or self.steps >= self.max_steps",
            "done = success or engine_done or self.steps >= self.max_steps", SCIENCEWORLD), "survived"),
    (Mutant("scienceworld: a move the parser did not understand has unknown progress, not none", SW,
            "progress = True if on_gold else (False if not understood else None)",
            "progress = True if on_gold else None", SCIENCEWORLD), "survived"),
    (Mutant("scienceworld: the objects list cut in the middle of a name", SW,
            'objects = objects[:self.objects_budget].rsplit(", ", 1)[0] + ", ..."',
            'objects = objects[:self.objects_budget] + ", ..."', SCIENCEWORLD), "survived"),
    (Mutant("scienceworld: the expert goes on along the gold path after the agent left it", SW,
            "self.expert_step = self.expert_step + 1 if on_gold else len(self.gold)",
            "self.expert_step = self.expert_step + 1 if on_gold else self.expert_step", SCIENCEWORLD), "killed"),
    (Mutant("scienceworld: 'reset task' among the valid actions", SW,
            'if a != "reset task"]\n                 if self.valid_actions', "]\n                 if self.valid_actions",
            SCIENCEWORLD), "survived"),
    # prefix trees and micro-batches
    (Mutant("collate: a sample's first token trained when its mask says so", PACKING,
            "    mask[:, 0] = False\n", "", PACKED), "survived"),
    (Mutant("collate: a per-token field some samples lack dropped for all", PACKING,
            '            raise ValueError(f"collate: {sum(present)} of {len(samples)} samples have {name}")\n', "",
            PACKED), "killed"),
    (Mutant("packing: a prompt that is the whole of the previous one shares nothing", PACKING,
            "    return min(len(a), len(b))\n\n\ndef row_length", "    return 0\n\n\ndef row_length", PACKED), "killed"),
    (Mutant("packing: the eager attention's tree mask inverted", PACKING,
            "masked_fill(~attention, torch.finfo(model.dtype).min)", "masked_fill(attention, torch.finfo(model.dtype).min)",
            PACKED), "survived"),
    (Mutant("batching: micro-batches built shortest first", PACKING,
            "ordered = sorted(items, key=length, reverse=True)", "ordered = sorted(items, key=length)", PACKED),
            "survived"),
    # the shared-prefix decoder and its kept cache
    (Mutant("kept cache: a shorter past's padding attended by its new turn", DECODE,
            "        mask[b, :length] = 1\n", "        mask[b, :width] = 1\n", DECODER), "killed"),
    (Mutant("shared decoder: a finished row keeps drawing tokens after its end", DECODE,
            "chosen = torch.where(unfinished, chosen, pad_id)", "chosen = chosen", DECODER), "killed"),
    (Mutant("kept cache: a reply kept under one token more than its keys and values hold", DECODE,
            "kept.put(prompt + reply[:n - 1], [", "kept.put(prompt + reply[:n], [", DECODER), "killed"),
    (Mutant("kept cache: a sequence the next prompt extends whole never dropped", DECODE,
            "kept.superseded = [key for key, length in reuse.values() if length == len(key)]",
            "kept.superseded = []", DECODER), "survived"),
    # PPO's critic
    (Mutant("critic: a non-finite value update applied", CRITIC,
            "                if torch.isfinite(norm):\n                    self.optimizer.step()",
            "                if True:\n                    self.optimizer.step()", CRITICS), "survived"),
    (Mutant("critic: its mini-batches never shuffled", CRITIC,
            "            rng.shuffle(order)\n", "", CRITICS), "survived"),
]


def unbroken(mutant: Mutant, root: Path) -> None:
    """The breakage's line is one no mutant in the table touches, and it applies once."""
    for known in MUTANTS:
        if known.path == mutant.path and (mutant.old in known.old or known.old in mutant.old):
            raise SystemExit(f"{mutant.name}: the table's '{known.name}' breaks the same line")
    count = (root / mutant.path).read_text().count(mutant.old)
    if count != 1:
        raise SystemExit(f"{mutant.name}: the line occurs {count} times")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--root", type=Path, required=True)
    parser.add_argument("--check", action="store_true", help="only check each breakage applies")
    args = parser.parse_args()
    root = args.root.resolve()
    for mutant, _ in PASS:
        unbroken(mutant, root)
    if args.check:
        return 0
    killed = right = 0
    for mutant, predicted in PASS:
        status, seconds, detail = run(mutant, root, 1200)
        verdict = "killed" if status.startswith("killed") else status
        killed += verdict == "killed"
        right += verdict == predicted
        print(f"{verdict:>10} (predicted {predicted:>8})  {seconds:5.0f} s  {mutant.name}  {detail}", flush=True)
    print(f"killed {killed} of {len(PASS)}; {right} predicted right")
    return 0


if __name__ == "__main__":
    sys.exit(main())
