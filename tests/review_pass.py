"""Reviewer's pass 26 (issue 45): single breakages written apart from the suite, each with the
verdict predicted before the run, on the modules with the fewest mutants per line: the recipe's
sections and their checks, the household worlds, the memory plan, the registries and the CLI's
arguments. Run on a clone with .venv-vllm:
    PYTEST_ADDOPTS="-n 2" .venv/bin/python tests/review_pass.py --root ../pass
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mutants import MUTANTS, Mutant, run  # noqa: E402

RL = "src/agentrl/config/rl.py"
SECTIONS = "src/agentrl/config/sections.py"
WORLD = "src/agentrl/envs/household/world.py"
PLAN = "src/agentrl/plan.py"
CLI = "src/agentrl/cli.py"
CONFIG = ["test_config.py", "test_cli.py", "test_settings.py"]
HOUSEHOLD = ["test_household.py", "test_layout.py", "test_evaluate.py"]
PLANS = ["test_plan.py", "test_cli.py"]

# (mutant, predicted verdict)
PASS = [
    # the RL section's checks and moved keys
    (Mutant("config: an older recipe's rl.workers refused without naming where it went", RL,
            '"workers": "env_pool.workers", ', "", CONFIG), "survived"),
    (Mutant("config: an older recipe's NTHR and coupling run after the recipe's own components", RL,
            'data["components"] = moved + list(data.get("components") or [])',
            'data["components"] = list(data.get("components") or []) + moved', CONFIG), "survived"),
    (Mutant("config: an older recipe's rl.coupling_lr not carried over", RL,
            'for key in ("every", "pairs", "lr")', 'for key in ("every", "pairs")', CONFIG), "survived"),
    # the shared sections
    (Mutant("config: infinite and NaN numbers accepted", SECTIONS,
            "allow_inf_nan=False)", "allow_inf_nan=True)", CONFIG), "survived"),
    (Mutant("tiny model: a hidden size off the 64 grid accepted", SECTIONS,
            "Field(128, ge=64, multiple_of=64)", "Field(128, ge=64)", CONFIG), "survived"),
    (Mutant("sampling: top_p above 1 accepted", SECTIONS, "Field(1.0, gt=0, le=1)", "Field(1.0, gt=0)",
            CONFIG), "survived"),
    (Mutant("prompt: a positional placeholder in a template escapes as a traceback", SECTIONS,
            "except (KeyError, IndexError, ValueError) as err:", "except (KeyError, ValueError) as err:",
            CONFIG + ["test_prompting.py"]), "survived"),
    (Mutant("prompt: invalid_penalty makes the expert data again", SECTIONS,
            'reward_only: ClassVar[tuple[str, ...]] = ("invalid_penalty",)', "reward_only: ClassVar[tuple[str, ...]] = ()",
            CONFIG + ["test_sft.py"]), "killed"),
    (Mutant("sft: the optimiser's default learning rate is RL's", SECTIONS,
            "Field(default_factory=lambda: OptimConfig(lr=1e-5))", "Field(default_factory=OptimConfig)",
            CONFIG + ["test_sft.py"]), "survived"),
    # the household worlds
    (Mutant("household: surface_variety ignored", WORLD, "rng.sample(SURFACES[:surface_variety],",
            "rng.sample(SURFACES,", HOUSEHOLD), "survived"),
    (Mutant("household: a pick-two goal asks for one", WORLD, 'return f"put two {kind} in {target}."',
            'return f"put a {kind} in {target}."', HOUSEHOLD), "survived"),
    (Mutant("household: L1 holds the held-out task types, L2 the in-domain ones", WORLD,
            'HELD_OUT_TYPES if split == "l2" else IN_DOMAIN_TYPES', 'HELD_OUT_TYPES if split == "l1" else IN_DOMAIN_TYPES',
            HOUSEHOLD), "killed"),
    # the memory plan
    (Mutant("plan: PPO's critic not planned", PLAN, 'if rl.advantage.type == "ppo":',
            'if rl.advantage.type == "gae":', PLANS), "survived"),
    (Mutant("plan: a config.json's key-value heads ignored", PLAN,
            'cfg.get("num_key_value_heads") or cfg["num_attention_heads"]', 'cfg["num_attention_heads"]', PLANS),
            "killed"),
    (Mutant("plan: a base model's hub id not matched to its Instruct shape", PLAN,
            'KNOWN_MODELS.get(path) or KNOWN_MODELS.get(path + "-Instruct")', "KNOWN_MODELS.get(path)", PLANS),
            "survived"),
    (Mutant("plan: the CPU log-prob head's rows not capped at a chunk", PLAN,
            "TORCH_HEAD_COPIES * min(tokens, CHUNK_ROWS)", "TORCH_HEAD_COPIES * tokens", PLANS), "survived"),
    # the CLI's arguments and the registries
    (Mutant("cli: data --split ignored", CLI, "episodes, judgments, args.split,", 'episodes, judgments, "train",',
            ["test_cli.py", "test_sft.py"]), "survived"),
    (Mutant("cli: analyze repeats' --resamples ignored", CLI, "sampling, args.resamples, args.max_steps,",
            "sampling, 10, args.max_steps,", ["test_cli.py", "test_analysis.py"]), "survived"),
    (Mutant("cli: plan --gpu-memory 0 accepted", CLI, "if args.gpus < 1 or args.gpu_memory <= 0:",
            "if args.gpus < 1:", PLANS), "survived"),
    (Mutant("registry: a section given as a config object refused", "src/agentrl/registry.py",
            "        if isinstance(data, BaseModel):\n            data = data.model_dump()\n", "",
            ["test_config.py", "test_plugins.py", "test_trainer.py"]), "killed"),
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
