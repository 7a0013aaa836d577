"""Reviewer's pass 20 (issue 45): single breakages written apart from the suite, each with the
verdict predicted before the run: the household engine's rules, goals, progress labels and
admissible actions; `agentrl serve` (the local judge endpoint); and the recipe's cross-field refusals and defaults (config/__init__.py, config/rl.py). Run on a clone:
    PYTEST_ADDOPTS="-n 2" .venv/bin/python tests/review_pass.py --root ../pass
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mutants import MUTANTS, Mutant, run  # noqa: E402

HOUSEHOLD = ["test_household.py", "test_testbed.py"]
CONFIG = ["test_config.py", "test_failures.py"]
ENV = "src/agentrl/envs/household/env.py"

# (mutant, predicted verdict)
PASS = [
    # the household engine
    (Mutant("household: a closed receptacle's contents can be taken", ENV,
            "            if self._accessible(loc):\n                if self.holding is None:",
            "            if True:\n                if self.holding is None:", HOUSEHOLD), "killed"),
    (Mutant("household: arriving at a closed receptacle counts as searching it", ENV,
            "            if self._accessible(recep):\n                self.inspected.add(recep)",
            "            if True:\n                self.inspected.add(recep)", HOUSEHOLD), "killed"),
    (Mutant("household: the expert's move labelled as no opinion instead of help", ENV,
            "        if action == self._expert_action():", "        if False:", HOUSEHOLD + ["test_gcd.py"]),
     "killed"),
    (Mutant("household: an inadmissible action applied all the same", ENV,
            "text = self._apply(action) if admissible else NOTHING",
            "text = self._apply(action) if action is not None else NOTHING", HOUSEHOLD), "killed"),
    (Mutant("household: an episode runs one step past its limit", ENV,
            "done = success or self.steps >= self.max_steps", "done = success or self.steps > self.max_steps",
            HOUSEHOLD), "killed"),
    (Mutant("household: the current receptacle left out of the go-to actions", ENV,
            'actions = [f"go to {r}" for r in self.task.layout.receptacles]',
            'actions = [f"go to {r}" for r in self.task.layout.receptacles if r != loc]', HOUSEHOLD), "survived"),
    # agentrl serve
    (Mutant("serve: n ignored, one choice returned", "src/agentrl/serve.py",
            "sampler.generate([ids] * n, params)", "sampler.generate([ids], params)", ["test_gcd.py", "test_evaluate.py"]),
     "killed"),
    (Mutant("serve: the request's temperature ignored", "src/agentrl/serve.py",
            'temperature=float(body.get("temperature", 1.0))', "temperature=1.0",
            ["test_gcd.py", "test_evaluate.py"]), "survived"),
    (Mutant("serve: the model list empty", "src/agentrl/serve.py",
            '"data": [{"id": name, "object": "model", "owned_by": "agentrl"}]', '"data": []',
            ["test_gcd.py", "test_evaluate.py"]), "survived"),
    # the recipe's cross-field refusals and defaults
    (Mutant("config: filter_groups accepted with groups of one", "src/agentrl/config/rl.py",
            "self.rollout.filter_groups is not None and self.group_size < 2",
            "self.rollout.filter_groups is not None and self.group_size < 1", CONFIG + ["test_trainer.py"]), "killed"),
    (Mutant("config: overlap accepted on a sharded actor", "src/agentrl/config/rl.py",
            'if self.overlap is not None and self.actor.backend != "single":', "if False:",
            CONFIG + ["test_overlap.py"]), "survived"),
    (Mutant("config: tis_cap accepted with the sampler's log-probs as the old ones", "src/agentrl/config/rl.py",
            'if self.tis_cap is not None and self.old_logprobs != "actor":', "if False:", CONFIG + ["test_trainer.py"]),
     "survived"),
    (Mutant("config: LoRA with a KL term accepted with vLLM on a sharded actor", "src/agentrl/config/rl.py",
            'getattr(self.actor, "lora", None) is not None and self.kl_coef > 0',
            'getattr(self.actor, "lora", None) is not None and self.kl_coef < 0', CONFIG), "survived"),
    (Mutant("config: judgment data accepted with an environment that lists no valid actions",
            "src/agentrl/config/__init__.py", 'getattr(self.env, "valid_actions", True) is False',
            'getattr(self.env, "valid_actions", True) is None', CONFIG + ["test_gcd.py"]), "survived"),
    (Mutant("config: judgment data accepted with full history", "src/agentrl/config/__init__.py",
            "        if self.sft is not None and self.sft.judgments:\n            readers",
            "        if False:\n            readers", CONFIG + ["test_gcd.py"]), "killed"),
    (Mutant("config: the SFT actor a single one whatever RL's is", "src/agentrl/config/__init__.py",
            "self.rl.actor.model_copy(deep=True) if self.rl is not None else",
            'ACTORS.make("single") if True else', CONFIG + ["test_sft.py"]), "survived"),
    (Mutant("config: the initial model's folder not under run_dir", "src/agentrl/config/__init__.py",
            'self.model.path = str(Path(self.run_dir) / "model-init")', 'self.model.path = "model-init"',
            CONFIG + ["test_plugins.py"]), "killed"),
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
