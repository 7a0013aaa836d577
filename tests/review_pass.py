"""Reviewer's pass 25 (issue 45): single breakages written apart from the suite, each with the
verdict predicted before the run, on modules with few mutants per line: rollout records, the
launch's wait for rank 0, and the ALFWorld environment's labels, observations and
preparation, and DAgger's round statistics. Run on a clone with .venv-vllm:
    PYTEST_ADDOPTS="-n 2" .venv/bin/python tests/review_pass.py --root ../pass
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mutants import MUTANTS, Mutant, run  # noqa: E402

TYPES = "src/agentrl/rollout/types.py"
DIST = "src/agentrl/distributed.py"
ENV = "src/agentrl/envs/alfworld/env.py"
ALFWORLD = ["test_alfworld.py", "test_gcd.py", "test_cli.py"]

# (mutant, predicted verdict)
PASS = [
    # rollout records
    (Mutant("records: an episode's length one short", TYPES, "        return len(self.steps)",
            "        return len(self.steps) - 1", ["test_trainer.py", "test_evaluate.py", "test_metrics.py"]), "killed"),
    # the rank helpers
    (Mutant("distributed: the launch's wait for rank 0 dropped (torch's default timeout)", DIST,
            'else "gloo", timeout=timeout)', 'else "gloo")', ["test_distributed.py"]), "survived"),
    # the ALFWorld environment
    (Mutant("alfworld: the planner's move never labelled good", ENV,
            "        if self._plan and action == self._plan[0]:\n            return True",
            "        if False:\n            return True", ALFWORLD), "survived"),
    (Mutant("alfworld: look, inventory and examine not labelled bad", ENV,
            'return False if action.split(" ", 1)[0] in USELESS_VERBS else None', "return None",
            ALFWORLD), "survived"),
    (Mutant("alfworld: prepare builds no train game", ENV, 'for split in ("train", "l0", "l1")',
            'for split in ("l0", "l1")', ALFWORLD), "survived"),
    (Mutant("alfworld: examine listed once per target in grouped actions", ENV,
            'GROUPED_VERBS = ("go to", "open", "close", "examine")', 'GROUPED_VERBS = ("go to", "open", "close")',
            ["test_alfworld.py"]), "killed"),
    (Mutant("alfworld: the game's banner left in the first observation", ENV,
            'text = feedback.split("=-", 1)[-1] if feedback.lstrip().startswith("-=") else feedback',
            "text = feedback", ALFWORLD), "killed"),
    (Mutant("alfworld: an inadmissible move labelled unknown, not bad", ENV,
            "        if not admissible:\n            return False", "        if not admissible:\n            return None",
            ALFWORLD), "survived"),
    # DAgger's rounds
    (Mutant("dagger: a round's aborted episodes counted in its success", "src/agentrl/dagger.py",
            "played = [t for t in self.trajectories if not t.aborted]", "played = list(self.trajectories)",
            ["test_dagger.py", "test_cli.py"]), "survived"),
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
