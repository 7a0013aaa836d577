"""Reviewer's pass 31 (issue 45): single breakages written apart from the suite, each with the
verdict predicted before the run, on features the issue names: the shared decoder's kept cache,
prefix trees and their layouts, ScienceWorld's splits, notebook and teleports, expert-data
collection, and the update's sampler gap, TIS weights and mini-batches. Run on a clone:
    PYTEST_ADDOPTS="-n 2" .venv/bin/python tests/review_pass.py --root ../pass
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mutants import MUTANTS, Mutant, run  # noqa: E402

DECODE = "src/agentrl/sampler/shared_decode.py"
PACKING = "src/agentrl/packing.py"
SCIENCEWORLD = "src/agentrl/envs/scienceworld/env.py"
DATA = "src/agentrl/data.py"
TRAINER = "src/agentrl/trainer.py"
DECODER = ["test_actor.py", "test_full_history.py"]
TREES = ["test_packing.py", "test_full_history.py", "test_actor.py"]
SW = ["test_scienceworld.py", "test_config.py", "test_settings.py"]
EXPERT = ["test_sft.py", "test_testbed.py", "test_alfworld.py", "test_settings.py"]
UPDATE = ["test_trainer.py", "test_distributed.py", "test_gcd.py"]

# (mutant, predicted verdict)
PASS = [
    (Mutant("kept cache: a dropped sequence's bytes still counted", DECODE,
            "            self.bytes -= self.entries.pop(key)[2]\n", "            self.entries.pop(key)\n", DECODER),
     "killed"),
    (Mutant("kept cache: cleared on new weights, its byte count kept", DECODE,
            "        self.leads.clear()\n        self.bytes = 0\n", "        self.leads.clear()\n", DECODER), "survived"),
    (Mutant("kept cache: sequences looked up by one token fewer than they are filed by", DECODE,
            "for key in self.leads.get(tuple(tokens[:self.LEAD]), ()):",
            "for key in self.leads.get(tuple(tokens[:self.LEAD - 1]), ()):", DECODER), "killed"),
    (Mutant("prefix trees: a row's length counted unpacked", PACKING,
            "        total += len(s.ids) - _shared(prefix, previous)\n", "        total += len(s.ids)\n", TREES),
     "survived"),
    (Mutant("prefix trees: a layout's work without its attention pairs", PACKING,
            "total += len(chunk) * width * (1 + pair_cost * width)", "total += len(chunk) * width", TREES), "survived"),
    (Mutant("prefix trees: only the modelled layout tried", PACKING,
            "for cost in dict.fromkeys((pack.pair_cost, 0.0))]", "for cost in (pack.pair_cost,)]", TREES), "survived"),
    (Mutant("prefix trees: subtree ends propagated parents first (one level only)", PACKING,
            "for column in range(n - 1, -1, -1):", "for column in range(n):", TREES), "killed"),
    (Mutant("prefix trees: a new row counted empty", PACKING,
            "            rows.append([s])\n            used = n\n", "            rows.append([s])\n            used = 0\n", TREES),
     "survived"),
    (Mutant("scienceworld notebook: a teleport not noted as an arrival", SCIENCEWORLD,
            'ARRIVED = re.compile(r"You (?:move|teleport) to the (.+?)\\.")', 'ARRIVED = re.compile(r"You move to the (.+?)\\.")',
            SW), "survived"),
    (Mutant("scienceworld teleports: a door opened then a walk elsewhere merged into one teleport", SCIENCEWORLD,
            "gold[j + 1] == GO + gold[j][len(OPEN_DOOR):]:", "gold[j + 1].startswith(GO):", SW), "survived"),
    (Mutant("scienceworld notebook: keeps the last 6 moves, not 12", SCIENCEWORLD,
            "    keep: int = 12\n", "    keep: int = 6\n", SW), "killed"),
    (Mutant("scienceworld: env.train_task_types narrows the evaluation splits too", SCIENCEWORLD,
            'if split == "train" and self.train_task_types is not None:', "if self.train_task_types is not None:", SW),
     "survived"),
    (Mutant("expert data: detours played in worker processes (the rng stream not shared)", DATA,
            "if workers <= 1 or detours:", "if workers <= 1:", EXPERT), "survived"),
    (Mutant("expert data: every episode counted as kept", DATA,
            "kept += bool(examples)", "kept += 1", EXPERT), "killed"),
    (Mutant("expert data: meta tags explore and monitor swapped", DATA,
            '"explore" if _goes_somewhere_new(action, visited) else "monitor"',
            '"monitor" if _goes_somewhere_new(action, visited) else "explore"', EXPERT), "survived"),
    (Mutant("update: the actor-sampler log-ratio reversed (TIS weights and gap inverted)", TRAINER,
            "log_ratio = actor_logp.float().cpu() - torch.tensor(sample.old_logprobs)",
            "log_ratio = torch.tensor(sample.old_logprobs) - actor_logp.float().cpu()", UPDATE), "killed"),
    (Mutant("update: processed tokens counted as trained tokens", TRAINER,
            "computed += sum(b.n_computed for batches, _ in parts for b in batches)",
            "computed += sum(b.n_tokens for batches, _ in parts for b in batches)", UPDATE), "killed"),
    (Mutant("update: an auxiliary loss's tokens counted on this rank only", TRAINER,
            "aux_tokens = distributed.all_sum([sum(s.n_targets for s in share)])[0]",
            "aux_tokens = sum(s.n_targets for s in share)", UPDATE), "survived"),
    (Mutant("update: every step's samples in the same order", TRAINER,
            "orders = epoch_orders(len(batch.samples), groups, rl.epochs, self.config.seed, step)",
            "orders = epoch_orders(len(batch.samples), groups, rl.epochs, self.config.seed, 0)", UPDATE), "survived"),
    (Mutant("update: the mini-batch count rounded down", TRAINER,
            "n_chunks = -(-int(distributed.all_sum([len(batch.samples)])[0]) // rl.mini_batch_size)",
            "n_chunks = int(distributed.all_sum([len(batch.samples)])[0]) // rl.mini_batch_size", UPDATE), "killed"),
]


def unbroken(mutant: Mutant, root: Path) -> None:
    """The breakage's line is one no mutant in the table touches, and it applies once."""
    for known in MUTANTS:
        if known.path == mutant.path and (mutant.old in known.old or known.old in mutant.old):
            raise SystemExit(f"{mutant.name}: the table's '{known.name}' breaks the same line")
    count = (root / mutant.path).read_text().count(mutant.old)
    if count != 1:
        raise SystemExit(f"{mutant.name}: the line occurs {count} times")
    compile(mutant_text(mutant, root), mutant.path, "exec")


def mutant_text(mutant: Mutant, root: Path) -> str:
    return (root / mutant.path).read_text().replace(mutant.old, mutant.new, 1)


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
