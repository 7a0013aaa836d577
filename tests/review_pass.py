"""Reviewer's pass 34 (issue 45): single breakages written apart from the suite, each with the
verdict predicted before the run, on lines no table mutant touches of the features the issue
names: compare's statistics for one seed and no spread, and its report's cells; the single
actor's update mode, non-finite steps and resumed master weights; prompt correction's summary;
the trainer's threads with an overlapped sampler; the testbed's expert noise; the
external judge's labelling. Run on a clone:
    PYTEST_ADDOPTS="-n 2" .venv/bin/python tests/review_pass.py --root ../pass
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mutants import MUTANTS, Mutant, run  # noqa: E402

STATS = "src/agentrl/stats.py"
COMPARE = "src/agentrl/compare.py"
SINGLE = "src/agentrl/actor/single.py"
STATISTICS = ["test_compare.py"]
ACTOR = ["test_actor.py", "test_trainer.py", "test_lora.py"]

# (mutant, predicted verdict)
PASS = [
    (Mutant("t-test: a p-value computed without spread", STATS,
            "    if len(values) < 2 or values.std() == 0:\n        return None\n",
            "    if len(values) < 2:\n        return None\n", STATISTICS), "killed"),
    (Mutant("band: one curve bootstrapped", STATS,
            "    if curves.shape[0] < 2:\n", "    if curves.shape[0] < 1:\n", STATISTICS), "survived"),
    (Mutant("P(A>B) interval: one seed bootstrapped", STATS,
            "    if len(x) < 2:\n        point = probability_of_improvement(x, y)\n",
            "    if len(x) < 1:\n        point = probability_of_improvement(x, y)\n", STATISTICS), "killed"),
    (Mutant("detectable difference: finite at one seed", STATS,
            "    if seeds < 2:\n        return math.inf\n", "    if seeds < 1:\n        return math.inf\n", STATISTICS),
     "killed"),
    (Mutant("seeds needed: sized for a difference of 0", STATS,
            "if parts.total_sd == 0 or difference <= 0:", "if parts.total_sd == 0 or difference < 0:", STATISTICS),
     "survived"),
    (Mutant("report: no t-test p-value shown as 0", COMPARE,
            "t_p = \"-\" if r[\"t_p\"] is None else f\"{r['t_p']:.3f}\"", "t_p = f\"{r['t_p'] or 0:.3f}\"", STATISTICS),
     "killed"),
    (Mutant("report: seeds to detect unknown shown as None", COMPARE,
            'need = " / ".join(str(v) if v is not None else "-" for v in r["seeds_to_detect"].values())',
            'need = " / ".join(str(v) for v in r["seeds_to_detect"].values())', STATISTICS), "killed"),
    (Mutant("actor: the update computed in eval mode (LoRA dropout off)", SINGLE,
            "        self.model.train()\n", "        self.model.eval()\n", ACTOR), "survived"),
    (Mutant("actor: a non-finite step applied", SINGLE,
            "finite = bool(torch.isfinite(grad_norm))", "finite = True", ACTOR), "killed"),
    (Mutant("actor: a resumed bf16 run's fp32 masters rebuilt from its weights", SINGLE,
            'masters = saved.get("master") or [p.float() for p, _ in low]', "masters = [p.float() for p, _ in low]",
            ACTOR), "survived"),
    (Mutant("actor: a tied head required in a checkpoint", SINGLE,
            'tied = {"lm_head.weight"} if self.model.config.tie_word_embeddings else set()', "tied = set()", ACTOR),
     "killed"),
    (Mutant("correction: the summary sampled at temperature 1", "src/agentrl/gcd/correction.py",
            "params = SamplingConfig(temperature=0.0, max_new_tokens=self.config.max_new_tokens)",
            "params = SamplingConfig(temperature=1.0, max_new_tokens=self.config.max_new_tokens)", ["test_gcd.py"]),
     "survived"),
    (Mutant("overlap: the trainer left on every thread", "src/agentrl/trainer.py",
            "            torch.set_num_threads(self.rl.overlap.trainer_threads)\n", "            pass\n",
            ["test_overlap.py"]), "killed"),
    (Mutant("testbed: the expert's key noise drawn where there are no keys", "src/agentrl/envs/testbed/env.py",
            "noisy = keys and random.Random(", "noisy = random.Random(", ["test_testbed.py"]), "survived"),
    (Mutant("LLM labels: the external judge asked with nothing left to label", "src/agentrl/gcd/labels.py",
            "if external is None or not unlabelled:", "if external is None:", ["test_gcd.py"]), "survived"),
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
