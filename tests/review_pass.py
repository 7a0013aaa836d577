"""Reviewer's pass 38 (issue 45): single breakages written apart from the suite, each with the
verdict predicted before the run, on lines no table mutant touches of the features the issue
names: the shared decoder's kept cache (its order, sizes, budget and weight check); chat datasets
and expert data (their checks, folder and workers); the critic (its checkpoint, gradients and
metrics). Run on a clone:
    PYTEST_ADDOPTS="-n 2" .venv/bin/python tests/review_pass.py --root ../pass
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mutants import MUTANTS, Mutant, run  # noqa: E402

DECODE = "src/agentrl/sampler/shared_decode.py"
DATA = "src/agentrl/data.py"
CRITIC = "src/agentrl/critic.py"
DECODE_TESTS = ["test_full_history.py"]
DATA_TESTS = ["test_sft.py", "test_failures.py", "test_cli.py"]
CRITIC_TESTS = ["test_trainer.py", "test_advantages.py"]

# (mutant, predicted verdict)
PASS = [
    (Mutant("kept cache: a sequence read not made the most recent (evicted first)", DECODE,
            "        self.entries.move_to_end(key)\n", "", DECODE_TESTS), "survived"),
    (Mutant("kept cache: a sequence put again counted twice", DECODE,
            "        self.drop(key)\n        self.entries[key] =", "        self.entries[key] =", DECODE_TESTS),
     "survived"),
    (Mutant("kept cache: a weight change seen on the first parameter only", DECODE,
            "version = [p._version for p in self.model.parameters()]",
            "version = [next(self.model.parameters())._version]", DECODE_TESTS), "survived"),
    (Mutant("kept cache: a sequence larger than the whole budget kept (the rest evicted for it)", DECODE,
            "if len(key) < self.LEAD or size > self.budget:", "if len(key) < self.LEAD:", DECODE_TESTS), "survived"),
    (Mutant("kept cache: its budget read in KiB", DECODE,
            "self.model, self.budget = model, budget_mib * 2**20", "self.model, self.budget = model, budget_mib * 2**10",
            DECODE_TESTS), "killed"),
    (Mutant("chat dataset: a file that is not UTF-8 read with a traceback", DATA,
            "    except UnicodeDecodeError as err:\n        raise ConfigError(f\"chat dataset",
            "    except LookupError as err:\n        raise ConfigError(f\"chat dataset", DATA_TESTS), "survived"),
    (Mutant("chat dataset: messages without a role or content accepted", DATA,
            'assert isinstance(messages, list) and all({"role", "content"} <= set(m) for m in messages)',
            "assert isinstance(messages, list)", DATA_TESTS), "survived"),
    (Mutant("expert data: its output's folder not made", DATA,
            "    path.parent.mkdir(parents=True, exist_ok=True)\n    won = kept = steps = 0\n",
            "    won = kept = steps = 0\n", DATA_TESTS), "killed"),
    (Mutant("expert data: its worker processes take Ctrl-C themselves", DATA,
            "    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C: the parent stops the pool\n", "",
            DATA_TESTS), "survived"),
    (Mutant("critic: its optimizer's state not saved", CRITIC,
            '        torch.save(self.optimizer.state_dict(), path / "optimizer.pt")\n', "", CRITIC_TESTS), "killed"),
    (Mutant("critic: gradients carried from one mini-batch into the next", CRITIC,
            "                self.optimizer.zero_grad(set_to_none=True)\n", "", CRITIC_TESTS), "survived"),
    (Mutant("critic: the value mean reported from the returns", CRITIC,
            '"critic/value_mean": statistics.fmean(values)', '"critic/value_mean": statistics.fmean(returns)',
            CRITIC_TESTS), "killed"),
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
