"""Reviewer's pass 35 (issue 45): single breakages written apart from the suite, each with the
verdict predicted before the run, on lines no table mutant touches of the features the issue
names: the critic's de-duplicated values, its update's metrics and checkpoint; the coupling lab's
classes; expert data's counts; the shared decoder's next turns; the rollout's and advantages'
metrics; the pool's slots; GCD's judge settings and error count. Run on a clone:
    PYTEST_ADDOPTS="-n 2" .venv/bin/python tests/review_pass.py --root ../pass
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mutants import MUTANTS, Mutant, run  # noqa: E402

CRITIC = "src/agentrl/critic.py"
TRAINER = "src/agentrl/trainer.py"
DECODE = "src/agentrl/sampler/shared_decode.py"
GCD = "src/agentrl/gcd/loss.py"
CRITIC_TESTS = ["test_advantages.py", "test_trainer.py"]
DECODE_TESTS = ["test_actor.py", "test_full_history.py", "test_plan.py"]
METRICS_TESTS = ["test_trainer.py", "test_full_history.py"]
GCD_TESTS = ["test_gcd.py", "test_failures.py", "test_full_history.py"]

# (mutant, predicted verdict)
PASS = [
    (Mutant("critic: a chunk's values written from the first prompt on", CRITIC,
            "for i, value in zip(part, self([prompts[i] for i in part]).tolist()):",
            "for i, value in zip(range(len(part)), self([prompts[i] for i in part]).tolist()):", CRITIC_TESTS),
     "survived"),
    (Mutant("critic: the value loss logged per chunk, not per mini-batch", CRITIC,
            'totals["value_loss"] += 0.5 * float(loss.detach().sum()) / len(idx)',
            'totals["value_loss"] += 0.5 * float(loss.detach().sum()) / len(part)', CRITIC_TESTS), "survived"),
    (Mutant("critic: metrics summed over mini-batches, not averaged", CRITIC,
            "                updates += 1\n", "                updates = 1\n", CRITIC_TESTS), "survived"),
    (Mutant("critic: a checkpoint without its critic loaded without the named error", CRITIC,
            "        if not file.is_file():\n", "        if False:\n", CRITIC_TESTS), "killed"),
    (Mutant("critic: value metrics of a single step sample", CRITIC,
            "    if len(values) < 2:\n        return {}\n", "    if len(values) < 1:\n        return {}\n",
            CRITIC_TESTS),
     "survived"),
    (Mutant("coupling: an empty class's mean gradient taken", "src/agentrl/analysis/coupling.py",
            "for name, pairs in sets.items() if pairs}", "for name, pairs in sets.items()}",
            ["test_analysis.py", "test_compare.py"]), "survived"),
    (Mutant("expert data: one example counted per episode", "src/agentrl/data.py",
            "            steps += len(examples)\n", "            steps += 1\n",
            ["test_sft.py", "test_testbed.py", "test_trainer.py"]), "killed"),
    (Mutant("shared decoder: a kept episode's next turn keeps its padding", DECODE,
            "layer.keys[b, :, width:width + len(new)]], 1)", "layer.keys[b, :, width:width + fresh]], 1)",
            DECODE_TESTS), "killed"),
    (Mutant("shared decoder: a prefilled prompt's values read from its keys", DECODE,
            "(layer.keys[r, :, index], layer.values[r, :, index])", "(layer.keys[r, :, index], layer.keys[r, :, index])",
            DECODE_TESTS), "killed"),
    (Mutant("rollout metrics: response tokens counted from the prompts", TRAINER,
            '"rollout/response_tokens": statistics.fmean(len(s.response_ids) for s in steps)',
            '"rollout/response_tokens": statistics.fmean(len(s.prompt_ids) for s in steps)', METRICS_TESTS),
     "survived"),
    (Mutant("advantage metrics: the IQR negated", TRAINER,
            '"adv/iqr": q3 - q1', '"adv/iqr": q1 - q3', METRICS_TESTS), "survived"),
    (Mutant("rollout metrics: success per task type summed, not averaged", TRAINER,
            'f"rollout/success/{kind}": statistics.fmean(wins)', 'f"rollout/success/{kind}": sum(wins)',
            METRICS_TESTS), "survived"),
    (Mutant("pool: slots shared out to workers in blocks", "src/agentrl/envs/pool.py",
            "shares.setdefault(slot % self.workers, {})[slot] = arg",
            "shares.setdefault(min(slot // 2, self.workers - 1), {})[slot] = arg", ["test_pool.py"]), "killed"),
    (Mutant("GCD: 'llm' labels accepted without an endpoint", GCD,
            '        if "llm" in self.labels and self.external is None:\n',
            '        if False:\n', GCD_TESTS), "killed"),
    (Mutant("GCD: the external judge's errors logged as 0", GCD,
            'metrics["labels/llm_errors"] = float(judge.external.errors)', 'metrics["labels/llm_errors"] = 0.0',
            GCD_TESTS), "killed"),
    (Mutant("GCD: an endpoint summariser accepted without an endpoint", GCD,
            'if self.correction and self.correction.summarizer == "endpoint" and self.external is None:',
            "if False:", GCD_TESTS), "killed"),
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
