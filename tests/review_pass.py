"""Reviewer's pass 30 (issue 45): single breakages written apart from the suite, each with the
verdict predicted before the run, on features the issue names: the testbed's tasks, actions and
what it shows, the policy loss, the KL in the reward and the reported entropy, compare's
statistics, PPO's critic, the HF sampler's weight push and log-probs. Run on a clone:
    PYTEST_ADDOPTS="-n 2" .venv/bin/python tests/review_pass.py --root ../pass
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mutants import MUTANTS, Mutant, run  # noqa: E402

TESTBED = "src/agentrl/envs/testbed/env.py"
POLICY = "src/agentrl/losses/policy.py"
REFERENCE = "src/agentrl/losses/reference.py"
STEP = "src/agentrl/losses/step.py"
STATS = "src/agentrl/stats.py"
CRITIC = "src/agentrl/critic.py"
HF = "src/agentrl/sampler/hf.py"
BED = ["test_testbed.py", "test_compare.py", "test_sft.py"]
KL = ["test_actor.py", "test_trainer.py", "test_lora.py", "test_metrics.py"]
COMPARE = ["test_compare.py"]
VALUE = ["test_advantages.py", "test_trainer.py"]
SAMPLER = ["test_trainer.py", "test_distributed.py", "test_pool.py"]

# (mutant, predicted verdict)
PASS = [
    (Mutant("testbed: every split's tasks are training tasks", TESTBED,
            'return [f"{split}-{i}" for i in range(size)]', 'return [f"train-{i}" for i in range(size)]', BED),
     "killed"),
    (Mutant("testbed: an action not on the admissible list applied", TESTBED,
            "admissible = action in self.admissible_actions()", "admissible = action is not None", BED), "killed"),
    (Mutant("testbed: any key taken is the chest's", TESTBED,
            "self.key = action.split()[1]", "self.key = self.corridor.goal", BED), "killed"),
    (Mutant("testbed: doors offered in the chest's room", TESTBED,
            'actions = [] if self._last() else [f"go through {d} door" for d in doors]',
            'actions = [f"go through {d} door" for d in doors]', BED), "killed"),
    (Mutant("testbed: only the first key named on the floor", TESTBED,
            "parts.append(f\"Keys lie on the floor: {', '.join(c.keys)}.\")",
            'parts.append(f"Keys lie on the floor: {c.keys[0]}.")', BED), "survived"),
    (Mutant("testbed: the task does not name the chest's colour", TESTBED,
            'task = f"reach the last room and open the {c.goal} chest."', 'task = "reach the last room and open the chest."',
            BED), "survived"),
    (Mutant("testbed: the expert walks past the key's room", TESTBED,
            "            if self.room < c.key_room:", "            if self.room <= c.key_room:", BED), "killed"),
    (Mutant("ppo clip: the optimistic objective (minimum of the two)", POLICY,
            "loss = torch.maximum(unclipped, clipped)", "loss = torch.minimum(unclipped, clipped)", KL), "killed"),
    (Mutant("dual clip: every negative advantage counted as dual-clipped", POLICY,
            'counts["pg_clipfrac_dual"] = dual.float().sum()', 'counts["pg_clipfrac_dual"] = (advantages < 0).float().sum()',
            KL + ["test_kernels.py"]), "killed"),
    (Mutant("kl in reward: the penalty always k1, whatever rl.kl_estimator", REFERENCE,
            "self.coef, self.kl = coef, KL_ESTIMATORS.get(estimator)", 'self.coef, self.kl = coef, KL_ESTIMATORS.get("k1")',
            KL), "killed"),
    (Mutant("entropy: the reported entropy weighted by the loss aggregation", STEP,
            'per_token={"entropy": entropy.sum().detach()}', 'per_token={"entropy": (batch.weight * entropy).sum().detach()}',
            KL), "survived"),
    (Mutant("compare: P(A>B)'s interval at 90%", STATS,
            "confidence_level=confidence, n_resamples=RESAMPLES, method=\"percentile\",\n                             rng=np.random.default_rng(seed))\n    return float(result",
            "confidence_level=0.9, n_resamples=RESAMPLES, method=\"percentile\",\n                             rng=np.random.default_rng(seed))\n    return float(result",
            COMPARE), "survived"),
    (Mutant("compare: seeds to detect a difference one fewer than needed", STATS,
            "            return seeds\n", "            return seeds - 1\n", COMPARE), "killed"),
    (Mutant("critic: the value head's weight not zeroed (V does not start at 0)", CRITIC,
            "        torch.nn.init.zeros_(self.head.weight)\n", "", VALUE), "killed"),
    (Mutant("critic: the clipped branch detached (the value gradient halved where unclipped)", CRITIC,
            "clipped = old + torch.clamp(v - old, -c, c)", "clipped = old + torch.clamp(v - old, -c, c).detach()",
            VALUE), "survived"),
    (Mutant("critic: explained variance reported as its complement", CRITIC,
            '"critic/explained_variance": 1 - residual / var if var > 0 else 0.0',
            '"critic/explained_variance": residual / var if var > 0 else 0.0', VALUE), "killed"),
    (Mutant("critic: every step's mini-batches in the same order", CRITIC,
            'random.Random(step_seed(self.seed, batch.step, "critic"))', "random.Random(self.seed)", VALUE),
     "survived"),
    (Mutant("sampler: a pushed weight copied only into the tensor it already is", HF,
            "if params[name].data_ptr() != tensor.data_ptr():", "if params[name].data_ptr() == tensor.data_ptr():",
            SAMPLER), "killed"),
    (Mutant("hf generate: log-probs at temperature 1 whatever the sampling temperature", HF,
            "temperature = 1.0 if greedy else params.temperature", "temperature = 1.0", SAMPLER + ["test_actor.py"]),
     "killed"),
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
