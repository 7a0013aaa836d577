"""Reviewer's pass 41 (issue 45): single breakages written apart from the suite, each with the
verdict predicted before the run, on lines no table mutant touches of the features the issue
names: `agentrl compare` (a method's summary over seeds, the paired differences and their sizing,
which pairs are reported, the Markdown's cells, the learning curves' plot, reading `--runs` and
training `--method`s). Run on a clone:
    PYTEST_ADDOPTS="-n 2" .venv/bin/python tests/review_pass.py --root ../pass
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mutants import MUTANTS, Mutant, run  # noqa: E402

COMPARE = "src/agentrl/compare.py"
COMPARE_TESTS = ["test_compare.py", "test_cli.py"]

# (mutant, predicted verdict)
PASS = [
    (Mutant("compare: a method's evaluation spread from its first seed only", COMPARE,
            "parts = stats.components(rates, [list(r.outcomes[split].values()) for r in runs])",
            "parts = stats.components(rates, [list(r.outcomes[split].values()) for r in runs[:1]])", COMPARE_TESTS),
     "killed"),
    (Mutant("compare: a method's per-seed rates sorted, not in its seeds' order", COMPARE,
            '"per_seed": rates, **_parts(parts)}', '"per_seed": sorted(rates), **_parts(parts)}', COMPARE_TESTS),
     "survived"),
    (Mutant("compare: a method's judge accuracy from its first seed only", COMPARE,
            'judged = [r.extras[split]["judge_accuracy"] for r in runs if',
            'judged = [r.extras[split]["judge_accuracy"] for r in runs[:1] if', COMPARE_TESTS), "killed"),
    (Mutant("compare: two methods without a common seed paired anyway", COMPARE,
            "    if not pairs:\n        return out\n", "", COMPARE_TESTS), "survived"),
    (Mutant("compare: two runs without a common evaluation task paired anyway", COMPARE,
            "            if not tasks:\n                raise ConfigError(", "            if False:\n                raise ConfigError(",
            COMPARE_TESTS), "survived"),
    (Mutant("compare: the paired t-test's p taken on A's rates, not the differences", COMPARE,
            '"t_p": stats.t_pvalue(diffs),', '"t_p": stats.t_pvalue(xs),', COMPARE_TESTS), "killed"),
    (Mutant("compare: the MDD sized for one seed more than the pair has", COMPARE,
            '"mdd": sized(stats.detectable_difference(parts, len(diffs))),',
            '"mdd": sized(stats.detectable_difference(parts, len(diffs) + 1)),', COMPARE_TESTS), "killed"),
    (Mutant("compare: every pair reported in both orders", COMPARE,
            "for a, b in itertools.combinations(methods, 2)}}", "for a, b in itertools.permutations(methods, 2)}}",
            COMPARE_TESTS), "survived"),
    (Mutant("compare: a zero in the report shown as a dash", COMPARE,
            'return "-" if value is None else "inf"', 'return "-" if not value else "inf"', COMPARE_TESTS), "survived"),
    (Mutant("compare: a curve of one logged point kept for the plot", COMPARE,
            "if any(sum(k in row for row in r.metrics) > 1 for runs", "if any(sum(k in row for row in r.metrics) > 0 for runs",
            COMPARE_TESTS), "survived"),
    (Mutant("compare: the curves over steps some seeds did not log", COMPARE,
            "steps = sorted(set.intersection(*(set(s) for s in series)))",
            "steps = sorted(set.union(*(set(s) for s in series)))", COMPARE_TESTS), "survived"),
    (Mutant("compare: no learning curves written", COMPARE,
            '    plot_curves(methods, out / "curves.png")\n', "", COMPARE_TESTS), "killed"),
    (Mutant("compare: a --runs phase that is none of the pipeline's passed on", COMPARE,
            "            if phase and phase not in PHASES:\n", "            if False:\n", COMPARE_TESTS), "survived"),
    (Mutant("compare: a --method name holding a slash accepted (a nested folder)", COMPARE,
            'if not sep or not name or "/" in name:', "if not sep or not name:", COMPARE_TESTS), "survived"),
    (Mutant("compare: a --method run whose settings changed continues over the old run's outputs", COMPARE,
            "                shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)\n",
            "                pass\n", COMPARE_TESTS), "survived"),
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
