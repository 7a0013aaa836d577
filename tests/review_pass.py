"""Reviewer's pass 23 (issue 45): single breakages written apart from the suite, each with the
verdict predicted before the run, on modules with few mutants per line: the actors' registry and
launch checks, LoRA's settings, the ALFWorld game set, `agentrl plot`, and the prompt settings'
checks. Run on a clone with .venv-vllm:
    PYTEST_ADDOPTS="-n 2" .venv/bin/python tests/review_pass.py --root ../pass
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mutants import MUTANTS, Mutant, run  # noqa: E402

ACTORS = "src/agentrl/actor/__init__.py"
GAMES = "src/agentrl/envs/alfworld/games.py"
PLOT = "src/agentrl/plot.py"

# (mutant, predicted verdict)
PASS = [
    # the actors' registry and launch checks
    (Mutant("actor: fsdp2 built without cpu_offload", ACTORS,
            "return FSDPActor(model, optim, config.mixed_precision, config.cpu_offload, config.activation_checkpointing)",
            "return FSDPActor(model, optim, config.mixed_precision, False, config.activation_checkpointing)",
            ["test_distributed.py", "test_settings.py", "test_actor.py"]), "survived"),
    (Mutant("actor: the one-process actor accepted on several ranks", ACTORS,
            "    if world > 1 and actor.backend == \"single\":", "    if False:",
            ["test_distributed.py", "test_failures.py", "test_config.py"]), "killed"),
    # LoRA's settings
    (Mutant("lora: dropout ignored", "src/agentrl/models.py", "lora_dropout=lora.dropout,", "lora_dropout=0.0,",
            ["test_lora.py", "test_settings.py"]), "survived"),
    (Mutant("lora: target_modules ignored", "src/agentrl/models.py",
            "target_modules=list(lora.target_modules), task_type",
            'target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"], task_type',
            ["test_lora.py", "test_settings.py"]), "killed"),
    # the ALFWorld game set
    (Mutant("alfworld: the archive unpacked again on every use", GAMES,
            '    if (target / "json_2.1.1").is_dir():\n        return target', "    if False:\n        return target",
            ["test_alfworld.py"]), "survived"),
    (Mutant("alfworld: a game id of an unknown task type accepted", GAMES,
            "    if kind not in TASK_TYPES:", "    if False:", ["test_alfworld.py"]), "survived"),
    (Mutant("alfworld: a game file built again on every reset", GAMES,
            "    if path.is_file():\n        return path\n    import alfworld",
            "    if False:\n        return path\n    import alfworld", ["test_alfworld.py"]), "survived"),
    (Mutant("alfworld: a game marked unsolvable", GAMES, '"solvable": True', '"solvable": False',
            ["test_alfworld.py"]), "killed"),
    (Mutant("alfworld: an archive without json_2.1.1/ taken as the game set", GAMES,
            '        if not (staging / "json_2.1.1").is_dir():\n            raise',
            "        if False:\n            raise", ["test_alfworld.py", "test_failures.py"]), "survived"),
    # agentrl plot
    (Mutant("plot: the SFT loss panel left out", PLOT, "    if sft_metrics.is_file():", "    if False:",
            ["test_metrics.py", "test_cli.py"]), "survived"),
    (Mutant("plot: the step's other seconds drawn as the whole step", PLOT,
            '[r["timing_s/step"] - b for r, b in zip(rows, bottom)]', '[r["timing_s/step"] for r in rows]',
            ["test_metrics.py"]), "killed"),
    (Mutant("plot: the evaluation's interval band left out", PLOT, "        if len(low) == len(steps):",
            "        if False:", ["test_metrics.py"]), "killed"),
    (Mutant("plot: a run folder's own logs/ not looked at", PLOT,
            'run_dir / "rl" / "logs" / "metrics.jsonl", run_dir / "logs" / "metrics.jsonl")',
            'run_dir / "rl" / "logs" / "metrics.jsonl",)', ["test_metrics.py", "test_cli.py"]), "survived"),
    # the prompt settings' checks
    (Mutant("prompt: an unknown placeholder in the turn template accepted", "src/agentrl/config/sections.py",
            '@field_validator("template", "turn_template")', '@field_validator("template")',
            ["test_config.py", "test_prompting.py", "test_full_history.py"]), "survived"),
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
