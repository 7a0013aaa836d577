"""Reviewer's pass 24 (issue 45): single breakages written apart from the suite, each with the
verdict predicted before the run, on modules with few mutants per line: the progress display and
the stage a stopped command names, the forward pass's checks, the sequence-ratio kernel's clip counts,
ALFWorld's engine speedups, task sampling, and the arguments of `agentrl analyze`, `compare` and
`serve`. Run on a clone with .venv-vllm:
    PYTEST_ADDOPTS="-n 2" .venv/bin/python tests/review_pass.py --root ../pass
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mutants import MUTANTS, Mutant, run  # noqa: E402

CLI = "src/agentrl/cli.py"
SPEEDUPS = "src/agentrl/envs/alfworld/speedups.py"
ANALYZE = ["test_analysis.py", "test_cli.py"]

# (mutant, predicted verdict)
PASS = [
    # the progress display and the stage a stopped command names
    (Mutant("progress: bars drawn into a log file", "src/agentrl/progress.py",
            "return not sys.stdout.isatty()", "return False", ["test_cli.py", "test_failures.py"]), "survived"),
    (Mutant("progress: the stage never set", "src/agentrl/progress.py", "    _stage[0] = text", "    pass",
            ["test_failures.py", "test_cli.py"]), "killed"),
    # the forward pass and the sequence-ratio kernel
    (Mutant("forward: an lm_head with a bias taken (the fused log-prob leaves it out)", "src/agentrl/forward.py",
            'if getattr(head, "bias", None) is not None:', "if False:",
            ["test_kernels.py", "test_actor.py", "test_models.py"]), "survived"),
    (Mutant("seq-ratio kernel: the dual clip counted on positive advantages", "src/agentrl/kernels/seq_ratio.py",
            "(((adv < 0) & (best > -adv * config.dual_clip))", "(((adv > 0) & (best > -adv * config.dual_clip))",
            ["test_kernels.py"]), "killed"),
    # ALFWorld's engine speedups
    (Mutant("speedups: uninstalled, then never installed again", SPEEDUPS, "    _ORIGINALS.clear()\n", "",
            ["test_alfworld.py"]), "survived"),
    (Mutant("speedups: a cached symbol handed out uncopied", SPEEDUPS,
            "return copy.deepcopy(parse_symbols(text, rule_name))", "return parse_symbols(text, rule_name)",
            ["test_alfworld.py"]), "killed"),
    (Mutant("speedups: one cached query's rule handed out to every caller", SPEEDUPS,
            "return Rule(rule.name, rule.preconditions, rule.postconditions)", "return rule",
            ["test_alfworld.py"]), "survived"),
    (Mutant("speedups: no PDDL translation cached", SPEEDUPS, "functools.lru_cache(maxsize=8)",
            "functools.lru_cache(maxsize=0)", ["test_alfworld.py"]), "survived"),
    # task sampling
    (Mutant("sample_tasks: by type groups each task alone", "src/agentrl/envs/base.py",
            "types.setdefault(env.task_type(task), []).append(task)", "types.setdefault(task, []).append(task)",
            ["test_settings.py", "test_trainer.py", "test_rollout_modes.py"]), "survived"),
    # the arguments of agentrl analyze, compare and serve
    (Mutant("cli: analyze repeats' --temperature ignored", CLI, "sampling = SamplingConfig(temperature=args.temperature,",
            "sampling = SamplingConfig(temperature=1.0,", ANALYZE), "survived"),
    (Mutant("cli: analyze repeats' --no-think ignored", CLI, "not args.no_think)}", "True)}", ANALYZE), "survived"),
    (Mutant("cli: analyze on an unreadable trajectories file raises", CLI,
            "    except (OSError, ValueError) as err:\n        print(err, file=sys.stderr)\n        return 2",
            "    except KeyError as err:\n        print(err, file=sys.stderr)\n        return 2", ANALYZE), "killed"),
    (Mutant("cli: compare's --coupling-pairs ignored", CLI, "args.coupling, args.coupling_pairs)", "args.coupling, 16)",
            ["test_compare.py", "test_cli.py"]), "survived"),
    (Mutant("cli: serve's --host ignored", CLI, "load_tokenizer(args.model), args.host, args.port,",
            'load_tokenizer(args.model), "127.0.0.1", args.port,', ["test_gcd.py", "test_cli.py"]), "survived"),
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
