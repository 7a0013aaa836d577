"""Reviewer's pass 18 (issue 45): single breakages written apart from the suite, each with the
verdict predicted before the run, aimed at the modules no mutant in the table touches: recipes as
files (`recipe.py`), the plugin loader (`registry.py`), atomic writes (`files.py`), the Triton
sequence-ratio kernel, `agentrl plot`, and the rank-0 helper of `distributed.py`. Run on a clone:
    PYTEST_ADDOPTS="-n 2" .venv/bin/python tests/review_pass.py --root ../pass
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mutants import MUTANTS, Mutant, run  # noqa: E402

RECIPES = ["test_config.py", "test_failures.py", "test_plugins.py", "test_cli.py"]
PLUGINS = ["test_plugins.py", "test_config.py", "test_failures.py"]

# (mutant, predicted verdict)
PASS = [
    # recipes as files
    (Mutant("recipe: an override's value kept as text, not read as YAML", "src/agentrl/recipe.py",
            '        node[leaf] = _read_yaml(value.encode(), f"override {item!r}")', "        node[leaf] = value",
            RECIPES), "killed"),
    (Mutant("recipe: a YAML error's line counted from 0", "src/agentrl/recipe.py",
            'where = f" at line {mark.line + 1}, column', 'where = f" at line {mark.line}, column', RECIPES),
     "killed"),
    (Mutant("recipe: its imports read from the working directory, not the recipe's folder", "src/agentrl/recipe.py",
            "loaded = [load_plugin(str(spec), path.parent) for spec in recipe_imports]",
            "loaded = [load_plugin(str(spec)) for spec in recipe_imports]", RECIPES), "killed"),
    (Mutant("recipe: the saved config records imports as written, not as resolved", "src/agentrl/recipe.py",
            '    data["imports"] = list(dict.fromkeys(loaded))',
            '    data["imports"] = list(recipe_imports) + list(imports)', RECIPES), "killed"),
    # plugins
    (Mutant("plugins: a second file of an imported module's name silently ignored", "src/agentrl/registry.py",
            '            if Path(getattr(loaded, "__file__", "") or "").resolve() != path:', "            if False:",
            PLUGINS), "survived"),
    (Mutant("plugins: an installed entry point that fails to load skipped", "src/agentrl/registry.py",
            '            raise PluginError(f"plugin entry point {point.name} ({point.value}): {err}") from err',
            "            continue", PLUGINS), "survived"),
    # atomic writes
    (Mutant("files: write_atomic writes in place", "src/agentrl/files.py",
            '    tmp = path.with_name(f".{path.name}.tmp")', "    tmp = path",
            ["test_failures.py", "test_records.py", "test_cli.py"]), "survived"),
    # the Triton sequence-ratio kernel (under TRITON_INTERPRET on CPU)
    (Mutant("seq-ratio kernel: a dual-clipped action still gets a gradient", "src/agentrl/kernels/seq_ratio.py",
            "            slope = tl.where(capped, 0.0, slope)", "            slope = slope", ["test_kernels.py"]),
     "killed"),
    (Mutant("seq-ratio kernel: the backward forgets the ratio", "src/agentrl/kernels/seq_ratio.py",
            "tl.store(coef_ptr + a, slope * ratio / n)", "tl.store(coef_ptr + a, slope / n)", ["test_kernels.py"]),
     "killed"),
    (Mutant("seq-ratio kernel: the clip fraction counted per action, not per token", "src/agentrl/kernels/seq_ratio.py",
            'stats = {"pg_clipfrac": ((clipped > -adv * ratio).float() * counts).sum()}',
            'stats = {"pg_clipfrac": (clipped > -adv * ratio).float().sum()}', ["test_kernels.py"]), "killed"),
    # agentrl plot
    (Mutant("plot: the evaluation band's upper edge drawn from ci95_low", "src/agentrl/plot.py",
            '        _, high = _series(rows, f"eval/{split}/ci95_high")',
            '        _, high = _series(rows, f"eval/{split}/ci95_low")', ["test_cli.py"]), "survived"),
    (Mutant("plot: the episode reward curve drawn from rollout success", "src/agentrl/plot.py",
            '    twin.plot(*_series(rows, "rollout/episode_reward"),',
            '    twin.plot(*_series(rows, "rollout/success"),', ["test_cli.py"]), "survived"),
    # distributed
    (Mutant("distributed: the other ranks go on with None when rank 0's work failed", "src/agentrl/distributed.py",
            '        raise RunError(f"rank 0 stopped ({value})")', "        return None",
            ["test_metrics.py", "test_distributed.py"]), "survived"),
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
