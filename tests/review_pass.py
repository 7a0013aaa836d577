"""Reviewer's pass 32 (issue 45): single breakages written apart from the suite, each with the
verdict predicted before the run, on lines no table mutant touches: GCD's judge (its accuracy,
endpoint and correction settings, its metrics), the rollout loop (progress, per-rank sampling
seeds, filtered groups' redraws, retries, the async batch window), prompts and expert tags,
NTHR's positive set, the household layouts, the overlapped sampler's checks and the memory plan's
parameter counts. Run on a clone:
    PYTEST_ADDOPTS="-n 2" .venv/bin/python tests/review_pass.py --root ../pass
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mutants import MUTANTS, Mutant, run  # noqa: E402

GCD = "src/agentrl/gcd/loss.py"
COLLECT = "src/agentrl/rollout/collect.py"
PROMPTING = "src/agentrl/prompting.py"
DATA = "src/agentrl/data.py"
PLAN = "src/agentrl/plan.py"
JUDGE = ["test_gcd.py", "test_config.py"]
ROLLOUT = ["test_rollout_modes.py", "test_trainer.py", "test_distributed.py"]
PROMPTS = ["test_prompting.py", "test_full_history.py", "test_sft.py"]

# (mutant, predicted verdict)
PASS = [
    (Mutant("GCD evaluation: an unparseable verdict counted right", GCD,
            "statistics.fmean(v == x.label for v, x in zip(verdicts, chosen))",
            "statistics.fmean(v in (x.label, None) for v, x in zip(verdicts, chosen))", JUDGE), "survived"),
    (Mutant("classifier judge: a logit of exactly 0 read as good", GCD,
            "((logits > 0).float() == batch.target)", "((logits >= 0).float() == batch.target)", JUDGE),
     "survived"),
    (Mutant("judge endpoint: agreement of all asks refused", GCD,
            "        if self.agree > self.asks:\n", "        if self.agree >= self.asks:\n", JUDGE), "survived"),
    (Mutant("GCD metrics: every labelled step counted too long", GCD,
            '"too_long": float(len(labelled) - len(fitting))', '"too_long": float(len(labelled))', JUDGE),
     "survived"),
    (Mutant("GCD settings: prompt correction allowed with the classifier judge", GCD,
            '        if self.correction and self.judge == "classifier":\n'
            '            raise ValueError("prompt correction needs the generative judge\'s critiques (judge: generative)")\n',
            "", JUDGE), "killed"),
    (Mutant("rollout: episodes aborted at reset never reported finished", COLLECT,
            "    finished(len(episodes) - len(active))\n", "", ROLLOUT), "survived"),
    (Mutant("rollout: every rank samples with the same seed", COLLECT,
            '"sampling" if world == 1 else f"sampling:{rank}"', '"sampling"', ROLLOUT), "survived"),
    (Mutant("filtered groups: redraws sized as if every new group will differ", COLLECT,
            "max(rate, 1 / share)", "max(rate, 1.0)", ROLLOUT), "survived"),
    (Mutant("retries: a state without an admissible list retried", COLLECT,
            "        if not e.observation.admissible_actions:\n            return True\n",
            "        if not e.observation.admissible_actions:\n            return False\n", ROLLOUT), "survived"),
    (Mutant("async rollout: the batch window waited out with no environment busy", COLLECT,
            "if not streaming and in_env and time.perf_counter() < first_ready + batch_window_s:",
            "if not streaming and time.perf_counter() < first_ready + batch_window_s:", ROLLOUT), "survived"),
    (Mutant("prompts: an empty history shown as nothing", PROMPTING,
            'history="\\n".join(lines) or "(none)"', 'history="\\n".join(lines)', PROMPTS), "killed"),
    (Mutant("reasoning tag: a tag after the action counts", PROMPTING,
            "    end = action if action >= 0 else len(lower)\n", "    end = len(lower)\n", PROMPTS), "survived"),
    (Mutant("expert tags: every go-to tagged as exploring", DATA,
            "    new = action not in visited\n", "    new = True\n", PROMPTS), "killed"),
    (Mutant("chat datasets: a line of spaces read as JSON", DATA,
            "        if not line.strip():\n", "        if not line:\n", PROMPTS), "survived"),
    (Mutant("NTHR: zero-advantage samples counted positive", "src/agentrl/advantages/nthr.py",
            "pos = [i for i in members if advantages[i] > 0]", "pos = [i for i in members if advantages[i] >= 0]",
            ["test_nthr.py", "test_trainer.py"]), "survived"),
    (Mutant("household: objects placed in appliances", "src/agentrl/envs/household/world.py",
            "        return [r for r in self.receptacles if r not in APPLIANCES]\n",
            "        return list(self.receptacles)\n", ["test_household.py", "test_prompting.py"]), "survived"),
    (Mutant("household: a second container of a kind given the first's name", "src/agentrl/envs/household/world.py",
            "        counts[kind] = counts.get(kind, 0) + 1\n", "        counts[kind] = 1\n",
            ["test_household.py", "test_prompting.py"]), "killed"),
    (Mutant("overlap: a step played other than the one due taken", "src/agentrl/rollout/ahead.py",
            "        if played != step:\n", "        if played > step:\n", ["test_overlap.py"]), "survived"),
    (Mutant("plan: one norm per layer", PLAN,
            "return attention + 3 * h * self.intermediate + 2 * h", "return attention + 3 * h * self.intermediate + h",
            ["test_plan.py"]), "killed"),
    (Mutant("plan: LoRA's parameters counted by the wider side only", PLAN,
            "lora.r * sum(shapes[m])", "lora.r * max(shapes[m])", ["test_plan.py"]), "killed"),
    (Mutant("plan: a tiny model's kv heads not capped by its heads", PLAN,
            "min(tiny.kv_heads, tiny.hidden_size // 64)", "tiny.kv_heads", ["test_plan.py"]), "survived"),
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
