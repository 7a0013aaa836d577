"""Reviewer's pass 36 (issue 45): single breakages written apart from the suite, each with the
verdict predicted before the run, on lines no table mutant touches of the features the issue
names: the pool's fault count and list; what decides a phase's reuse (plugin hashes, section
settings, model fingerprints, the record itself); evaluation's summary and its record of
finished splits; the testbed's splits. Run on a clone:
    PYTEST_ADDOPTS="-n 2" .venv/bin/python tests/review_pass.py --root ../pass
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mutants import MUTANTS, Mutant, run  # noqa: E402

POOL = "src/agentrl/envs/pool.py"
PROVENANCE = "src/agentrl/provenance.py"
EVALUATE = "src/agentrl/evaluate.py"
TESTBED = "src/agentrl/envs/testbed/env.py"
POOL_TESTS = ["test_pool.py", "test_failures.py"]
PROVENANCE_TESTS = ["test_settings.py", "test_cli.py", "test_plugins.py", "test_evaluate.py", "test_failures.py"]
EVALUATE_TESTS = ["test_evaluate.py", "test_cli.py", "test_compare.py"]
TESTBED_TESTS = ["test_testbed.py"]

# (mutant, predicted verdict)
PASS = [
    (Mutant("pool: a worker's start failures in a row counted as one", POOL,
            "            self._start_failures[worker] += 1\n", "            self._start_failures[worker] = 1\n",
            POOL_TESTS), "killed"),
    (Mutant("pool: a worker's fault left out of the run's list", POOL,
            'self.faults.append(f"worker {worker} {cause}")', "self.faults.clear()", POOL_TESTS), "killed"),
    (Mutant("provenance: a phase run afresh announced as reused", PROVENANCE,
            'self.say(f"{name}: running")', 'self.say(f"{name}: reused")', PROVENANCE_TESTS), "survived"),
    (Mutant("provenance: a phase reused with its output gone", PROVENANCE,
            "        if previous is None or not output_exists:\n", "        if previous is None:\n",
            PROVENANCE_TESTS), "killed"),
    (Mutant("provenance: the phases record written without its folder", PROVENANCE,
            "        self.path.parent.mkdir(parents=True, exist_ok=True)\n", "", PROVENANCE_TESTS), "killed"),
    (Mutant("provenance: a section's settings taken by name prefix", PROVENANCE,
            "if any(k == p or k.startswith(p + \".\") for p in paths)", "if any(k.startswith(p) for p in paths)",
            PROVENANCE_TESTS), "survived"),
    (Mutant("provenance: a model folder fingerprinted by the folder's own times", PROVENANCE,
            "        stat = file.stat()\n", "        stat = path.stat()\n", PROVENANCE_TESTS), "killed"),
    (Mutant("evaluation: no episode given the interval [0, 1]", EVALUATE,
            "    if n == 0:\n        return 0.0, 0.0\n", "    if n == 0:\n        return 0.0, 1.0\n", EVALUATE_TESTS),
     "survived"),
    (Mutant("evaluation: per-type counts with successes and episodes swapped", EVALUATE,
            '{"success": sum(v), "episodes": len(v)}', '{"success": len(v), "episodes": sum(v)}', EVALUATE_TESTS),
     "killed"),
    (Mutant("evaluation: the mean score taken from the returns", EVALUATE,
            '"mean_score": sum(t.score for t in trajectories)',
            '"mean_score": sum(t.episode_reward for t in trajectories)', EVALUATE_TESTS), "killed"),
    (Mutant("evaluation: the output folder not made", EVALUATE,
            "            out_dir.mkdir(parents=True, exist_ok=True)\n            write_trajectories",
            "            write_trajectories", EVALUATE_TESTS), "killed"),
    (Mutant("evaluation: a split's record kept without the settings it depends on", EVALUATE,
            'done = out_dir / f"{split}.done.json" if out_dir is not None and settings is not None else None',
            'done = out_dir / f"{split}.done.json" if out_dir is not None else None', EVALUATE_TESTS), "survived"),
    (Mutant("testbed: an unknown split's tasks listed", TESTBED,
            "        if split not in SPLITS:\n            raise ValueError(f\"unknown split",
            "        if False:\n            raise ValueError(f\"unknown split", TESTBED_TESTS), "survived"),
    (Mutant("testbed: steps not counted toward the limit", TESTBED,
            "        self.steps += 1\n", "        self.steps += 0\n", TESTBED_TESTS), "killed"),
    (Mutant("testbed: a task id of an unknown split accepted", TESTBED,
            "    if split not in SPLITS or not index.isdigit():\n", "    if not index.isdigit():\n", TESTBED_TESTS),
     "survived"),
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
