"""Reviewer's pass 37 (issue 45): single breakages written apart from the suite, each with the
verdict predicted before the run, on lines no table mutant touches of the features the issue
names: compare's discovery of run folders and phases; the Ray transport of the environment pool
and the process transport's exit codes; DAgger's rounds (their play, numbers and epochs);
ScienceWorld's splits and templates. Run on a clone:
    PYTEST_ADDOPTS="-n 2" .venv/bin/python tests/review_pass.py --root ../pass
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mutants import MUTANTS, Mutant, run  # noqa: E402

COMPARE = "src/agentrl/compare.py"
POOL = "src/agentrl/envs/pool.py"
DAGGER = "src/agentrl/dagger.py"
PIPELINE = "src/agentrl/pipeline.py"
SCIENCEWORLD = "src/agentrl/envs/scienceworld/env.py"
COMPARE_TESTS = ["test_compare.py"]
RAY_TESTS = ["test_ray_pool.py"]
POOL_TESTS = ["test_pool.py", "test_failures.py"]
DAGGER_TESTS = ["test_dagger.py", "test_cli.py"]
SCIENCEWORLD_TESTS = ["test_scienceworld.py"]

# (mutant, predicted verdict)
PASS = [
    (Mutant("compare: a folder named by name=DIR that is itself a run never read as one", COMPARE,
            "folders = [folder] if _is_run(folder) and not any(map(_is_run, folder.iterdir())) else",
            "folders = [] if _is_run(folder) and not any(map(_is_run, folder.iterdir())) else",
            COMPARE_TESTS), "survived"),
    (Mutant("compare: a name=DIR without run folders read as a method without runs", COMPARE,
            "            if not folders:\n                raise ConfigError(f\"--runs {spec}: no run folders",
            "            if False:\n                raise ConfigError(f\"--runs {spec}: no run folders",
            COMPARE_TESTS), "survived"),
    (Mutant("compare: a run's training metrics never read", COMPARE,
            "    return read_metrics(path) if path.is_file() else []\n", "    return []\n", COMPARE_TESTS), "killed"),
    (Mutant("compare: a pipeline's initial phase read as its RL result", COMPARE,
            '    if phase != "rl":\n        return _read_eval(', '    if phase == "sft":\n        return _read_eval(',
            COMPARE_TESTS), "survived"),
    (Mutant("ray pool: the local cluster's fit counted in workers, not their CPUs", POOL,
            "have < workers * cfg.ray.num_cpus:", "have < workers:", RAY_TESTS), "survived"),
    (Mutant("ray pool: a refused pool leaves the cluster it started running", POOL,
            "            self.close()\n            raise ConfigError(", "            raise ConfigError(", RAY_TESTS),
     "survived"),
    (Mutant("ray pool: a dead actor's call raised, not answered None", POOL,
            "        except self.ray.exceptions.RayActorError:\n            return None\n",
            "        except self.ray.exceptions.RayActorError:\n            raise\n", RAY_TESTS), "killed"),
    (Mutant("ray pool: a cluster the pool joined shut down at its close", POOL,
            "        if self.owns_cluster:\n            self.ray.shutdown()\n", "        self.ray.shutdown()\n",
            RAY_TESTS), "killed"),
    (Mutant("pool: a dead worker's exit code read before it is reaped", POOL,
            "            self.procs[worker].join(timeout=5)\n            return None\n", "            return None\n",
            POOL_TESTS), "killed"),
    (Mutant("dagger: a round's labelling play not seeded", PIPELINE,
            "        torch.manual_seed(config.seed * 1000 + number)\n", "", DAGGER_TESTS), "survived"),
    (Mutant("dagger: a round's numbers not recorded in rounds.jsonl", PIPELINE,
            '            f.write(json.dumps({"round": number, **vars(stats)}) + "\\n")\n', "            pass\n",
            DAGGER_TESTS), "survived"),
    (Mutant("dagger: the rounds trained for sft.epochs, not sft.dagger.epochs", PIPELINE,
            'round_config = config.model_copy(update={"sft": config.sft.model_copy(update={"epochs": dagger.epochs})})',
            "round_config = config", DAGGER_TESTS), "survived"),
    (Mutant("dagger: every round played at the first round's expert share", DAGGER,
            "expert_share(dagger, round_number), rng)", "expert_share(dagger, 1), rng)", DAGGER_TESTS), "survived"),
    (Mutant("scienceworld: the engine's `reset task` shown among the action templates", SCIENCEWORLD,
            'self.templates = [t for t in self._engine.get_possible_actions() if t != "reset task"]',
            "self.templates = list(self._engine.get_possible_actions())", SCIENCEWORLD_TESTS), "survived"),
    (Mutant("scienceworld: an unknown split name taken to the split files", SCIENCEWORLD,
            '        if split not in ("train", *SPLIT_FILES):\n', "        if False:\n", SCIENCEWORLD_TESTS),
     "survived"),
    (Mutant("scienceworld: a missing split file read anyway", SCIENCEWORLD,
            "    if not path.is_file():\n        raise ConfigError(f\"env.splits_dir: ScienceWorld split file",
            "    if False:\n        raise ConfigError(f\"env.splits_dir: ScienceWorld split file",
            SCIENCEWORLD_TESTS), "killed"),
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
