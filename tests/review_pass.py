"""Reviewer's pass 17 (issue 45): single breakages written apart from the suite, each with the
verdict predicted before the run, aimed at what the recipe-wide settings table (test_settings.py)
cannot see by its construction: a setting honoured by one of its readers and dropped by another
(the table compares one part of a run per setting), and a setting still read but misapplied (the
table asks only that another value changes something). Run on a clone:
    PYTEST_ADDOPTS="-n 2" .venv/bin/python tests/review_pass.py --root ../pass
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mutants import MUTANTS, TRAINER, Mutant, run  # noqa: E402

DATA = ["test_sft.py", "test_full_history.py", "test_cli.py", "test_settings.py"]
GCD = ["test_gcd.py", "test_full_history.py", "test_settings.py"]

# (mutant, predicted verdict)
PASS = [
    # one reader of several dropped
    (Mutant("expert data: later full-history turns rendered with prompt.template, not turn_template",
            "src/agentrl/data.py",
            "            user = render_prompt(prompt.turn_template, obs, [], step, 0)",
            "            user = render_prompt(prompt.template, obs, history, step, prompt.history_length)",
            DATA), "killed"),
    (Mutant("expert data: prompt.history_length ignored (no earlier steps shown)", "src/agentrl/data.py",
            "            user = render_prompt(prompt.template, obs, history, step, prompt.history_length)",
            "            user = render_prompt(prompt.template, obs, history, step, 0)", DATA), "killed"),
    (Mutant("judgment data: play() ignores prompt.history_length", "src/agentrl/data.py",
            "        text = render_prompt(prompt.template, obs, history, step, prompt.history_length)",
            "        text = render_prompt(prompt.template, obs, history, step, 0)",
            [*GCD, "test_analysis.py", "test_trainer.py"]), "survived"),
    (Mutant("correction: an endpoint summarizer's reply not limited by correction.max_new_tokens",
            "src/agentrl/gcd/correction.py",
            "self.endpoint.complete(prompt, 1, 0.0, self.config.max_new_tokens)",
            "self.endpoint.complete(prompt, 1, 0.0, 96)", GCD), "survived"),
    (Mutant("gcd: a pair kept whatever its judgment's length (the judge's max_new_tokens not in fits)",
            "src/agentrl/gcd/loss.py",
            "                    self.config.sampling.max_new_tokens)", "                    1)", GCD), "killed"),
    (Mutant("dagger: an episode's end on the context ignores sft.dagger.sampling.max_new_tokens",
            "src/agentrl/dagger.py",
            "                         reply_tokens=sampling.max_new_tokens)", "                         reply_tokens=1)",
            ["test_dagger.py", "test_full_history.py", "test_settings.py"]), "survived"),
    (Mutant("rollout: the sampler's context never ends an episode", "src/agentrl/rollout/collect.py",
            '                         getattr(sampler, "context_length", None), sampling.max_new_tokens)',
            "                         None, sampling.max_new_tokens)",
            ["test_full_history.py", "test_rollout_modes.py", "test_settings.py"]), "killed"),
    (Mutant("kl in reward: the penalty always estimated with k3", "src/agentrl/losses/reference.py",
            "parts.append(KLRewardPenalty(rl.kl_coef, rl.kl_estimator))",
            'parts.append(KLRewardPenalty(rl.kl_coef, "k3"))', TRAINER), "killed"),
    (Mutant("nthr: its log-probs at temperature 1 whatever sampling.temperature", "src/agentrl/advantages/nthr.py",
            "        self.temperature = ctx.config.sampling.temperature or 1.0", "        self.temperature = 1.0",
            ["test_nthr.py", "test_settings.py", "test_trainer.py"]), "survived"),
    (Mutant("old_logprobs actor: the actor scores at temperature 1 whatever sampling.temperature",
            "src/agentrl/trainer.py",
            "        rl, temperature = self.rl, self.config.sampling.temperature or 1.0",
            "        rl, temperature = self.rl, 1.0", [*TRAINER, "test_settings.py"]), "survived"),
    (Mutant("rollout: group ids not offset by rank (two ranks' groups share ids)", "src/agentrl/rollout/collect.py",
            "* rl.tasks_per_step + rank * share  # unique in the run", "* rl.tasks_per_step  # unique in the run",
            ["test_distributed.py", "test_trainer.py", "test_settings.py"]), "killed"),
    # a setting read but misapplied
    (Mutant("plan: vLLM with kv_cache_gib planned without its copy of the weights", "src/agentrl/plan.py",
            'parts["sampler"] = arch.params * b + rl.sampler.kv_cache_gib * GIB',
            'parts["sampler"] = rl.sampler.kv_cache_gib * GIB', ["test_plan.py", "test_settings.py", "test_cli.py"]),
     "killed"),
    (Mutant("dagger: one round plays the last expert share instead of the first", "src/agentrl/dagger.py",
            "    if dagger.rounds == 1:\n        return first", "    if dagger.rounds == 1:\n        return last",
            ["test_dagger.py", "test_settings.py"]), "survived"),
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
