"""Reviewer's pass 33 (issue 45): single breakages written apart from the suite, each with the
verdict predicted before the run, on lines no table mutant touches of the features the issue
names: compare's rates, paired differences, report and run discovery; what decides the reuse of
SFT checkpoints and DAgger rounds; the environment pool's restarts and counts; the
judge endpoint's replies; the coupling lab's classes; the trainer's first weight push and its
uniform-group count. Run on a clone:
    PYTEST_ADDOPTS="-n 2" .venv/bin/python tests/review_pass.py --root ../pass
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mutants import MUTANTS, Mutant, run  # noqa: E402

COMPARE = "src/agentrl/compare.py"
PIPELINE = "src/agentrl/pipeline.py"
POOL = "src/agentrl/envs/pool.py"
JUDGE = "src/agentrl/gcd/judge.py"
COUPLING = "src/agentrl/analysis/coupling.py"
TRAINER = "src/agentrl/trainer.py"
REUSE = ["test_dagger.py", "test_sft.py", "test_cli.py"]
ENDPOINT = ["test_gcd.py", "test_failures.py"]

# (mutant, predicted verdict)
PASS = [
    (Mutant("compare: a seed's rate the median of its episodes", COMPARE,
            "float(np.mean(list(r.outcomes[split].values())))", "float(np.median(list(r.outcomes[split].values())))",
            ["test_compare.py"]), "killed"),
    (Mutant("compare: paired differences taken B - A", COMPARE,
            "[x.outcomes[split][t] - y.outcomes[split][t] for t in tasks]",
            "[y.outcomes[split][t] - x.outcomes[split][t] for t in tasks]", ["test_compare.py"]), "killed"),
    (Mutant("compare: the report's interval ends swapped", COMPARE,
            "[{_pts(m[s]['ci95'][0])}, {_pts(m[s]['ci95'][1])}] ({_pts(m[s]['iqm'])})",
            "[{_pts(m[s]['ci95'][1])}, {_pts(m[s]['ci95'][0])}] ({_pts(m[s]['iqm'])})", ["test_compare.py"]),
     "survived"),
    (Mutant("compare: a method folder counted only when everything in it is a run", COMPARE,
            "if d.is_dir() and any(map(_is_run, d.iterdir()))", "if d.is_dir() and all(map(_is_run, d.iterdir()))",
            ["test_compare.py"]), "survived"),
    (Mutant("sft: a rerun with another save_every starts over", PIPELINE,
            '                    **config_settings(config, "seed", "sft", exclude=SFT_CONTINUABLE)}',
            '                    **config_settings(config, "seed", "sft")}', REUSE), "killed"),
    (Mutant("dagger: a round's labels reused whatever model made them", PIPELINE,
            '"dagger.round": number, "dagger.model": folder_fingerprint(model_path)}', '"dagger.round": number}',
            REUSE), "survived"),
    (Mutant("dagger: every round's labels sampled with the same seed", PIPELINE,
            "torch.manual_seed(config.seed * 1000 + number)", "torch.manual_seed(config.seed * 1000)", REUSE),
     "survived"),
    (Mutant("dagger: a round reused with its model missing", PIPELINE,
            'if _phases(work).reusable(name, settings, (model / "config.json").exists()):',
            "if _phases(work).reusable(name, settings, True):", REUSE), "survived"),
    (Mutant("pool: a worker restarted once more than the limit", POOL,
            "if self._start_failures[worker] >= START_FAILURES:", "if self._start_failures[worker] > START_FAILURES:",
            ["test_pool.py"]), "survived"),
    (Mutant("pool: answers not yet received left out of the pending count", POOL,
            "return len(self._arrived) + sum(len(slots) for queue in self._queue for _, slots in queue)",
            "return sum(len(slots) for queue in self._queue for _, slots in queue)", ["test_pool.py", "test_cli.py"]),
     "survived"),
    (Mutant("pool: the main-guard hint given for every fault", POOL,
            '{MAIN_GUARD_HINT}" if any(self._start_failures) else ""', '{MAIN_GUARD_HINT}"', ["test_pool.py"]),
     "survived"),
    (Mutant("endpoint: a reply that is not an object read as one", JUDGE,
            'choices = reply.get("choices") if isinstance(reply, dict) else None', 'choices = reply.get("choices")',
            ENDPOINT), "survived"),
    (Mutant("endpoint: a message content of any type taken", JUDGE,
            "if not isinstance(content, (str, type(None))):", "if not isinstance(content, object):", ENDPOINT),
     "survived"),
    (Mutant("endpoint: an empty content kept as None", JUDGE,
            'texts.append(content or "")', "texts.append(content)", ENDPOINT), "survived"),
    (Mutant("coupling: same class decided by the trained sample alone", COUPLING,
            "(same if labels[i] == labels[j] else different)", "(same if labels[i] else different)",
            ["test_analysis.py"]), "killed"),
    (Mutant("coupling: metrics attempted with one class missing", COUPLING,
            "    if not good or not bad:\n", "    if not good and not bad:\n", ["test_analysis.py"]), "survived"),
    (Mutant("trainer: no first weight push to the sampler", TRAINER,
            "        self.sampler.update_weights(self.actor.weights())  # a no-op for a sampler sharing the actor's module\n",
            "", ["test_trainer.py", "test_distributed.py", "test_lora.py"]), "survived"),
    (Mutant("rollout metrics: broken groups counted uniform", TRAINER,
            "uniform = len(group_by_id(trajectories)) - len(broken) - len(differing_groups(trajectories))",
            "uniform = len(group_by_id(trajectories)) - len(differing_groups(trajectories))", ["test_trainer.py"]),
     "survived"),
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
