"""Reviewer's pass 40 (issue 45): single breakages written apart from the suite, each with the
verdict predicted before the run, on lines no table mutant touches of the features the issue
names: the statistics a comparison over seeds reports (the bootstrap and t intervals at two seeds,
the learning curves' band, the seeds a difference needs) and evaluation (what a split's success
counts, its rates, its batches, its stage, its abort message, its per-split records). Run on a clone:
    PYTEST_ADDOPTS="-n 2" .venv/bin/python tests/review_pass.py --root ../pass
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mutants import MUTANTS, Mutant, run  # noqa: E402

STATS = "src/agentrl/stats.py"
EVALUATE = "src/agentrl/evaluate.py"
STATS_TESTS = ["test_compare.py"]
EVALUATE_TESTS = ["test_evaluate.py", "test_cli.py", "test_failures.py", "test_compare.py"]

# (mutant, predicted verdict)
PASS = [
    (Mutant("stats: two seeds' bootstrap interval a point", STATS,
            "    if len(values) < 2:\n        return float(values.mean()), float(values.mean())",
            "    if len(values) < 3:\n        return float(values.mean()), float(values.mean())", STATS_TESTS), "killed"),
    (Mutant("stats: two seeds' t-interval a point", STATS,
            "    if len(values) < 2 or values.std() == 0:\n        return mean, mean",
            "    if len(values) < 3 or values.std() == 0:\n        return mean, mean", STATS_TESTS), "killed"),
    (Mutant("stats: the curves' band resampled over steps, not seeds", STATS,
            "stats.bootstrap((curves,), np.mean, axis=0,", "stats.bootstrap((curves,), np.mean, axis=1,", STATS_TESTS),
     "killed"),
    (Mutant("stats: the curves' band unseeded", STATS,
            "                             method=\"percentile\", rng=np.random.default_rng(seed))\n    return result.confidence_interval.low, result",
            "                             method=\"percentile\", rng=None)\n    return result.confidence_interval.low, result",
            STATS_TESTS), "killed"),
    (Mutant("stats: the curves' band at 50% whatever the confidence asked", STATS,
            "axis=0, confidence_level=confidence, n_resamples=2000", "axis=0, confidence_level=0.5, n_resamples=2000",
            STATS_TESTS), "survived"),
    (Mutant("stats: seeds to detect a difference sized without any spread measured", STATS,
            "    if parts.total_sd == 0 or difference <= 0:\n", "    if difference <= 0:\n", STATS_TESTS), "killed"),
    (Mutant("stats: P(X > Y)'s interval resamples X against itself", STATS,
            "    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)\n    if len(x) < 2:",
            "    x, y = np.asarray(x, dtype=float), np.asarray(x, dtype=float)\n    if len(x) < 2:", STATS_TESTS),
     "killed"),
    (Mutant("eval: aborted episodes counted as failures in the success rate", EVALUATE,
            '"success": wins / max(n, 1)', '"success": wins / max(n + aborted, 1)', EVALUATE_TESTS), "survived"),
    (Mutant("eval: the invalid-action rate per episode, not per step", EVALUATE,
            '"invalid_rate": sum(not s.valid for s in steps) / max(len(steps), 1)',
            '"invalid_rate": sum(not s.valid for s in steps) / max(n, 1)', EVALUATE_TESTS), "survived"),
    (Mutant("eval: the aborted episodes not counted", EVALUATE,
            "    aborted = sum(t.aborted for t in trajectories)\n", "    aborted = 0\n", EVALUATE_TESTS), "killed"),
    (Mutant("eval: each batch one task longer (batches overlap)", EVALUATE,
            "tasks[start:start + size], 1, prompt", "tasks[start:start + size + 1], 1, prompt", EVALUATE_TESTS),
     "killed"),
    (Mutant("eval: a split's stage not named (Ctrl-C says the one before)", EVALUATE,
            '        set_stage(f"evaluation {split}")\n', "", EVALUATE_TESTS), "survived"),
    (Mutant("eval: the abort message's episodes counted without the aborted ones", EVALUATE,
            'f"evaluation on {split}: {aborted} of {finished + aborted} episodes',
            'f"evaluation on {split}: {aborted} of {finished} episodes', EVALUATE_TESTS), "killed"),
    (Mutant("eval: only the first split's record removed once results.json is written", EVALUATE,
            "for split in eval_cfg.splits:  # the whole evaluation's record", "for split in eval_cfg.splits[:1]:  # the whole evaluation's record",
            EVALUATE_TESTS), "survived"),
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
