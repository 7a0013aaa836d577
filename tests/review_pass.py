"""Reviewer's pass 19 (issue 45): single breakages written apart from the suite, each with the
verdict predicted before the run, on the modules with the fewest mutants per line: the household
world's splits and placements, ALFWorld's split folders, the task sampler, the Triton fused
log-prob's online statistics, the command line (resume, SIGTERM, --overwrite, eval of a checkpoint
folder), the tokenizer's padding side, export and the single actor's activation checkpointing.
Run on a clone:
    PYTEST_ADDOPTS="-n 2" .venv/bin/python tests/review_pass.py --root ../pass
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mutants import MUTANTS, Mutant, run  # noqa: E402

HOUSEHOLD = ["test_household.py", "test_testbed.py"]
CLI = ["test_cli.py", "test_failures.py"]

# (mutant, predicted verdict)
PASS = [
    # the household world
    (Mutant("household: L1 tasks placed in seen layouts", "src/agentrl/envs/household/world.py",
            'if split in ("train", "l0"):', 'if split in ("train", "l0", "l1"):', HOUSEHOLD), "killed"),
    (Mutant("household: a distractor may be of the task's own kind", "src/agentrl/envs/household/world.py",
            "others = [k for k in allowed_kinds(object_variety) if k != kind]",
            "others = allowed_kinds(object_variety)", HOUSEHOLD), "survived"),
    (Mutant("household: the target receptacle may be the desk", "src/agentrl/envs/household/world.py",
            "target_kind = receptacle_kind(rng.choice([r for r in storage if r != DESK]))",
            "target_kind = receptacle_kind(rng.choice(storage))", HOUSEHOLD), "survived"),
    (Mutant("household: containers not openable", "src/agentrl/envs/household/world.py",
            "openable = frozenset(n for n in names if receptacle_kind(n) in CONTAINERS) | OPENABLE_APPLIANCES",
            "openable = frozenset(OPENABLE_APPLIANCES)", HOUSEHOLD), "killed"),
    # ALFWorld's splits and the task sampler
    (Mutant("alfworld: L0 read from valid_unseen", "src/agentrl/envs/alfworld/games.py",
            '"l0": "valid_seen"', '"l0": "valid_unseen"', ["test_alfworld.py"]), "killed"),
    (Mutant("sample_tasks: the split's last task never drawn", "src/agentrl/envs/base.py",
            "return [tasks[rng.randrange(len(tasks))] for _ in range(n)]",
            "return [tasks[rng.randrange(max(1, len(tasks) - 1))] for _ in range(n)]",
            ["test_trainer.py", "test_household.py", "test_scienceworld.py"]), "survived"),
    # the Triton fused log-prob (under TRITON_INTERPRET on CPU)
    (Mutant("linear log-prob (triton): the entropy sum not rescaled when the running max moves",
            "src/agentrl/kernels/linear_logprob.py",
            "a = a * scale + tl.sum(", "a = a + tl.sum(", ["test_kernels.py"]), "killed"),
    (Mutant("linear log-prob (triton): vocabulary splits' entropy sums merged without their scales",
            "src/agentrl/kernels/linear_logprob.py",
            "lse - (a * scale).sum(0) / total", "lse - a.sum(0) / total", ["test_kernels.py"]), "killed"),
    # the command line
    (Mutant("cli: --resume accepted against changed settings", "src/agentrl/cli.py",
            'if ckpt is not None and args.resume and "rl" in phases.done:', "if False:", CLI), "killed"),
    (Mutant("cli: SIGTERM exits 130 like Ctrl-C", "src/agentrl/cli.py",
            '("terminated", 143)', '("terminated", 130)', CLI), "killed"),
    (Mutant("cli: --overwrite keeps the old run's folder", "src/agentrl/cli.py",
            "            shutil.rmtree(run_dir, ignore_errors=True)", "            pass", CLI), "survived"),
    (Mutant("cli: eval of a checkpoint folder loads the folder, not its model", "src/agentrl/cli.py",
            "        checkpoint = checkpoint / \"model\"\n    results", "        checkpoint = checkpoint\n    results",
            CLI + ["test_evaluate.py"]), "survived"),
    # models and the actor
    (Mutant("models: the tokenizer pads on the right", "src/agentrl/models.py",
            'tokenizer.padding_side = "left"', 'tokenizer.padding_side = "right"',
            ["test_models.py", "test_trainer.py"]), "killed"),
    (Mutant("models: export leaves the prompt the model was trained with behind", "src/agentrl/models.py",
            "        shutil.copyfile(folder / PROMPT_FILE, out / PROMPT_FILE)", "        pass",
            ["test_models.py", "test_cli.py", "test_lora.py"]), "survived"),
    (Mutant("actor: activation checkpointing ignored by the single actor", "src/agentrl/actor/__init__.py",
            "        model.gradient_checkpointing_enable()", "        pass",
            ["test_actor.py", "test_settings.py"]), "survived"),
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
