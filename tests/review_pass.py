"""Reviewer's pass 39 (issue 45): single breakages written apart from the suite, each with the
verdict predicted before the run, on lines no table mutant touches of the features the issue
names: the rollout's rules of an episode (lock-step's progress, the action a step records, which
episodes the context ends, the conversation a DAgger label is asked in, async batching); replies'
reasoning tags, the window's history lines, full history's stop tokens and turn fields, the
prompt record beside a model; prefix trees' boundaries and their cost model. Run on a clone:
    PYTEST_ADDOPTS="-n 2" .venv/bin/python tests/review_pass.py --root ../pass
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mutants import MUTANTS, Mutant, run  # noqa: E402

COLLECT = "src/agentrl/rollout/collect.py"
PROMPTING = "src/agentrl/prompting.py"
PACKING = "src/agentrl/packing.py"
COLLECT_TESTS = ["test_rollout_modes.py", "test_scienceworld.py", "test_full_history.py", "test_prompting.py",
                 "test_dagger.py"]
PROMPTING_TESTS = ["test_prompting.py", "test_full_history.py", "test_advantages.py"]
PACKING_TESTS = ["test_packing.py"]

# (mutant, predicted verdict)
PASS = [
    (Mutant("rollout: lock-step's progress told every active episode ended each turn", COLLECT,
            "        finished(len(active) - len(still))\n", "        finished(len(active))\n", COLLECT_TESTS),
     "survived"),
    (Mutant("rollout: a step's action recorded without the reasoning prompt.require_think asks for", COLLECT,
            "        action = parse_action(response, self.prompt.require_think)\n        e.trajectory.steps.append(",
            "        action = parse_action(response, False)\n        e.trajectory.steps.append(", COLLECT_TESTS),
     "survived"),
    (Mutant("rollout: a window's episode ended by the context as full history's are", COLLECT,
            "if self.turns is None or self.context is None:", "if self.context is None:", COLLECT_TESTS), "survived"),
    (Mutant("full history: a turn's {step} counted from 2", COLLECT,
            "render_prompt(self.prompt.turn_template, e.observation, [], len(steps), 0)",
            "render_prompt(self.prompt.turn_template, e.observation, [], len(steps) + 1, 0)", COLLECT_TESTS),
     "survived"),
    (Mutant("rollout: a window's label asked with the episode's earlier turns", COLLECT,
            "earlier = e.trajectory.steps if self.turns is not None else []", "earlier = e.trajectory.steps",
            COLLECT_TESTS), "survived"),
    (Mutant("async rollout: the batch window restarted at every answer, not at the first ready", COLLECT,
            "max(0.0, first_ready + batch_window_s - time.perf_counter())", "batch_window_s", COLLECT_TESTS),
     "survived"),
    (Mutant("parsing: RLVMR's meta tags not taken as the reasoning", PROMPTING,
            "    if require_think and reasoning_tag(response) is None:\n",
            '    if require_think and "<think>" not in lower:\n', PROMPTING_TESTS), "killed"),
    (Mutant("window: a history entry's action before its observation", PROMPTING,
            'lines = [f"Observation: {h.observation}\\nAction: {h.action}" for h in recent]',
            'lines = [f"Action: {h.action}\\nObservation: {h.observation}" for h in recent]', PROMPTING_TESTS),
     "killed"),
    (Mutant("parsing: an empty action tag read as an action", PROMPTING,
            "    return action or None\n", "    return action\n", PROMPTING_TESTS), "survived"),
    (Mutant("full history: only the end-of-sequence token taken as a reply's stop", PROMPTING,
            "self.special = set(tokenizer.all_special_ids)", "self.special = {tokenizer.eos_token_id}",
            PROMPTING_TESTS), "survived"),
    (Mutant("prompt record: a model folder without one read anyway", PROMPTING,
            "    if not path.is_file():\n        return []\n    trained = json.loads(",
            "    trained = json.loads(", PROMPTING_TESTS), "killed"),
    (Mutant("prefix trees: a sample's first token may be trained (no prefix)", PACKING,
            "    for t in range(1, len(sample.ids)):\n        if sample.mask[t]:",
            "    for t in range(len(sample.ids)):\n        if sample.mask[t]:", PACKING_TESTS), "survived"),
    (Mutant("prefix trees: the cost model's head size from the hidden size alone", PACKING,
            'head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads',
            "head_dim = config.hidden_size // heads", PACKING_TESTS), "survived"),
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
