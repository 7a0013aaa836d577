"""Reviewer's pass 16 (issue 45): single breakages written apart from the suite, on lines no mutant
in tests/mutants.py breaks, each with the verdict predicted before the run. Run on a clone:
    PYTEST_ADDOPTS="-n 2" .venv/bin/python tests/review_pass.py --root ../pass
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mutants import MUTANTS, TRAINER, Mutant, run  # noqa: E402

# (mutant, predicted verdict)
PASS = [
    (Mutant("critic: critic_path ignored, the critic always the actor's start", "src/agentrl/critic.py",
            "critic = Critic(config.critic_path or ctx.model_path,", "critic = Critic(ctx.model_path,",
            ["test_trainer.py", "test_advantages.py", "test_config.py"]), "survived"),
    (Mutant("critic: critic_weight_decay ignored", "src/agentrl/critic.py",
            "weight_decay=config.critic_weight_decay)", "weight_decay=0.0)",
            ["test_trainer.py", "test_advantages.py", "test_config.py"]), "survived"),
    (Mutant("critic: critic_grad_clip ignored", "src/agentrl/critic.py",
            "clip_grad_norm_(self.parameters(), self.config.critic_grad_clip)",
            "clip_grad_norm_(self.parameters(), 1.0)",
            ["test_trainer.py", "test_advantages.py", "test_config.py"]), "survived"),
    (Mutant("critic: the value head's bias left at its random init (V does not start at 0)", "src/agentrl/critic.py",
            "        torch.nn.init.zeros_(self.head.bias)\n", "",
            ["test_trainer.py", "test_advantages.py"]), "killed"),
    (Mutant("critic: a tie of the two value errors counted as clipped", "src/agentrl/critic.py",
            "((clipped - target) ** 2 > (v - target) ** 2).sum()", "((clipped - target) ** 2 >= (v - target) ** 2).sum()",
            ["test_trainer.py", "test_advantages.py"]), "survived"),
    (Mutant("step batch: the advantages handed to the trajectories in reverse order", "src/agentrl/components.py",
            "flat = [a for values in advantages.values for a in values]",
            "flat = [a for values in reversed(advantages.values) for a in values]", TRAINER), "killed"),
    (Mutant("timing: a phase timed twice in a step keeps only its last time", "src/agentrl/components.py",
            "timing[key] = timing.get(key, 0.0) + time.perf_counter() - start",
            "timing[key] = time.perf_counter() - start", [*TRAINER, "test_metrics.py", "test_cli.py"]), "survived"),
    (Mutant("seq_ratio: each action's token count doubled (half the mean log-ratio)", "src/agentrl/losses/policy.py",
            "index_add(0, segments, torch.ones_like(log_ratio))", "index_add(0, segments, torch.full_like(log_ratio, 2.0))",
            ["test_actor.py", "test_kernels.py"]), "killed"),
    (Mutant("kl: the penalty also put in the reward when the loss carries the KL", "src/agentrl/losses/reference.py",
            "    if rl.kl_in_reward:\n", "    if True:\n", TRAINER), "survived"),
    (Mutant("sft: sft.save_every ignored (a checkpoint only at each epoch's end)", "src/agentrl/sft.py",
            "save_every = sft_cfg.save_every or steps_per_epoch", "save_every = steps_per_epoch",
            ["test_sft.py", "test_distributed.py"]), "killed"),
    (Mutant("rollouts: one more saved step kept than rl.save_rollouts", "src/agentrl/trainer.py",
            "if int(old.name[5:11]) <= step - rl.save_rollouts:", "if int(old.name[5:11]) < step - rl.save_rollouts:",
            ["test_trainer.py", "test_cli.py"]), "killed"),
    (Mutant("metrics: tokens/response counted over every epoch", "src/agentrl/trainer.py",
            'metrics["tokens/response"] = float(trained / rl.epochs)', 'metrics["tokens/response"] = float(trained)',
            [*TRAINER, "test_metrics.py", "test_packing.py"]), "survived"),
    (Mutant("metrics: generation throughput measured over the update's time", "src/agentrl/trainer.py",
            'generated / max(timing.get("gen", 0.0), 1e-9)', 'generated / max(timing["update"], 1e-9)',
            [*TRAINER, "test_metrics.py", "test_cli.py"]), "survived"),
    (Mutant("checkpoint: a step saved again (a resumed run re-saving it) fails on the folder there", "src/agentrl/checkpoint.py",
            "        if final.exists():\n            shutil.rmtree(final)\n", "",
            ["test_trainer.py", "test_sft.py", "test_failures.py"]), "survived"),
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
    args = parser.parse_args()
    root = args.root.resolve()
    for mutant, _ in PASS:
        unbroken(mutant, root)
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
