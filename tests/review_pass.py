"""Reviewer's pass 22 (issue 45): single breakages written apart from the suite, each with the
verdict predicted before the run, on modules with few mutants per line: NTHR, PPO's advantages,
the registries, the rank helpers, the metrics tracker, rollout records, the actors' gradient
accumulation, the latency wrapper and the CLI's arguments. Run on a clone with .venv-vllm:
    PYTEST_ADDOPTS="-n 2" .venv/bin/python tests/review_pass.py --root ../pass
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mutants import MUTANTS, Mutant, run  # noqa: E402

NTHR = "src/agentrl/advantages/nthr.py"
PPO = "src/agentrl/advantages/ppo.py"
REG = "src/agentrl/registry.py"
DIST = "src/agentrl/distributed.py"
CLI = "src/agentrl/cli.py"

# (mutant, predicted verdict)
PASS = [
    # NTHR
    (Mutant("nthr: the reference level the positives' summed coupling, not its mean", NTHR,
            "reference = coupling(h_pos, y_pos, p_pos, h_pos, y_pos, p_pos).sum(1).mean()",
            "reference = coupling(h_pos, y_pos, p_pos, h_pos, y_pos, p_pos).sum(1).sum()", ["test_nthr.py"]),
     "killed"),
    (Mutant("nthr: the coupling's p_b[y_a] term added", NTHR,
            "- p_a[:, y_b] - p_b[:, y_a].T + p_a @ p_b.T", "- p_a[:, y_b] + p_b[:, y_a].T + p_a @ p_b.T",
            ["test_nthr.py"]), "killed"),
    (Mutant("nthr: the down-weighted share counts the untouched tokens", NTHR,
            "downweighted = sum(x != 1.0 for w", "downweighted = sum(x == 1.0 for w", ["test_nthr.py"]), "survived"),
    # PPO's advantages
    (Mutant("ppo: the critic's target is the advantage alone", PPO,
            "returns.append([a + value for a, value in zip(adv, values)])", "returns.append(list(adv))",
            ["test_advantages.py", "test_trainer.py"]), "killed"),
    (Mutant("ppo: advantages whitened with normalize: false", PPO, "    if config.normalize:  # whitened",
            "    if True:  # whitened", ["test_advantages.py", "test_trainer.py"]), "survived"),
    # the registries
    (Mutant("registry: the names a recipe can use include the always-built entries", REG,
            "return sorted(name for name, entry in self._entries.items() if not entry.always)",
            "return sorted(name for name, entry in self._entries.items())", ["test_plugins.py", "test_config.py"]),
     "survived"),
    (Mutant("registry: a config class whose type defaults to another name accepted", REG,
            "if field is None or field.default != name:", "if field is None:", ["test_plugins.py"]), "killed"),
    (Mutant("registry: a second registration under a taken name replaces the first", REG,
            "if name in self._entries and self._entries[name].target is not obj:", "if False:",
            ["test_plugins.py"]), "killed"),
    # the rank helpers
    (Mutant("distributed: sums over ranks in float32 (exact only to 2^24)", DIST,
            "    tensor = torch.tensor(values, dtype=torch.float64, device=device())",
            "    tensor = torch.tensor(values, dtype=torch.float32, device=device())",
            ["test_metrics.py", "test_distributed.py"]), "survived"),
    # the metrics tracker
    (Mutant("tracking: the config panel logged again on every resume", "src/agentrl/tracking.py",
            "if config is not None and resume_step == 0:", "if config is not None:",
            ["test_metrics.py", "test_trainer.py"]), "survived"),
    # rollout records
    (Mutant("records: two invalid steps in a row counted as a repeated action", "src/agentrl/rollout/types.py",
            "if b is not None and a == b)", "if a == b)", ["test_records.py", "test_trainer.py", "test_evaluate.py"]),
     "survived"),
    # the actors' shared parts
    (Mutant("actor: the metrics of a rank's padding repeats tallied", "src/agentrl/actor/base.py",
            "        if scale:\n            tally.add(out)", "        if True:\n            tally.add(out)",
            ["test_actor.py", "test_distributed.py"]), "killed"),
    # the latency wrapper
    (Mutant("latency: the expert's answer not delayed", "src/agentrl/envs/latency/__init__.py",
            '        self._wait("expert")\n', "", ["test_pool.py", "test_rollout_modes.py", "test_settings.py"]),
     "survived"),
    (Mutant("latency: the median taken as the log of the median", "src/agentrl/envs/latency/__init__.py",
            "self._rng.lognormvariate(math.log(median), sigma)", "self._rng.lognormvariate(median, sigma)",
            ["test_pool.py", "test_rollout_modes.py", "test_settings.py"]), "killed"),
    # the CLI's arguments
    (Mutant("cli: export's --base ignored", CLI, "print(export_model(args.checkpoint, args.out, args.base))",
            "print(export_model(args.checkpoint, args.out))", ["test_cli.py", "test_lora.py"]), "survived"),
    (Mutant("cli: data --judgments 0 taken as unset", CLI,
            "judgments = args.judgments if args.judgments is not None else (",
            "judgments = args.judgments or (", ["test_cli.py", "test_gcd.py", "test_sft.py"]), "survived"),
    (Mutant("cli: plan --context ignored", CLI, "context=args.context)", "context=2048)",
            ["test_cli.py", "test_plan.py"]), "survived"),
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
