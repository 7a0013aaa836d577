"""A reviewer's pass waiting for its run (the eleventh, written in session 66): breakages of the
families issue 45 names (compare's report, the pool's faults, the testbed's signals, what decides
reuse, GCD's labels, the coupling lab, the sampler-actor gap), written from the source and not the
tests (one look at test_compare.py while checking a snippet showed a tied-seed breakage would die,
so it was left out), each checked against every mutant's snippet (none breaks a line the table
breaks the same way), each with the verdict predicted before any run (committed before the run so
that the predictions cannot follow the results). Run it on a clone, never on a checkout a training
run is using:

    git clone -q . ../pass && ln -s $PWD/.venv ../pass/.venv && .venv/bin/python tests/review_pass.py --root ../pass [--only TEXT]

Once run, the results go to docs/tests.md, each survivor gets a test, the breakages join
`mutants.py`, and this file goes.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mutants import COMPARE, GCD, PROVENANCE, TESTBED, Mutant, run  # noqa: E402

P: list[tuple[Mutant, str]] = []
"""Each breakage with its predicted verdict."""


def m(name: str, path: str, old: str, new: str, tests: list[str], prediction: str) -> None:
    P.append((Mutant(name, path, old, new, tests), prediction))


# --- compare (3)
C = "src/agentrl/compare.py"
m("compare: one seed's t-interval marked as excluding 0", C,
  't_excl = " *" if len(p["seeds"]) > 1 and', 't_excl = " *" if len(p["seeds"]) > 0 and', COMPARE, "killed")
m("compare: a trained run started over keeps the old run's evaluations", C,
  'for path in (run_dir / "checkpoints", run_dir / "logs", run_dir / "eval", run_dir / "config.yaml"):',
  'for path in (run_dir / "checkpoints", run_dir / "logs", run_dir / "config.yaml"):', COMPARE, "survives")
m("compare: a return's per-seed values rounded to whole units", C,
  "f'{v * scale:.{0 if scale == 100 else 1}f}'", "f'{v * scale:.0f}'", COMPARE, "survives")

# --- the pool's faults (2)
PO = "src/agentrl/envs/pool.py"
m("pool: a hung worker counted as one that exited before answering", PO,
  'if cause.startswith("exited") and not self._answered[worker]:', "if not self._answered[worker]:",
  ["test_pool.py", "test_failures.py"], "survives")
m("pool: the fault summary names the oldest faults", PO,
  'shown = "; ".join(self.faults[-last:])', 'shown = "; ".join(self.faults[:last])',
  ["test_pool.py", "test_failures.py"], "survives")

# --- the testbed's signals (2)
TB = "src/agentrl/envs/testbed/env.py"
m("testbed: a useless move's progress unknown, not False", TB,
  "True if progress else False if useless else None", "True if progress else None", [*TESTBED, "test_gcd.py"],
  "survives")
m("testbed: the keys still shown on the floor once one is taken", TB,
  "if self.room == c.key_room and self.key is None:", "if self.room == c.key_room:", TESTBED, "survives")

# --- what decides reuse (2)
PV = "src/agentrl/provenance.py"
m("provenance: a setting recorded under its old name counted as changed", PV,
  "old = {RENAMED.get(k, k): v for k, v in old.items()", "old = {k: v for k, v in old.items()",
  [*PROVENANCE, "test_compare.py"], "killed")
m("provenance: DAgger's expert_median_s missing from the old behaviours", PV,
  '"env.expert_median_s": 0.0, "dagger.env.expert_median_s": 0.0}', '"env.expert_median_s": 0.0}',
  [*PROVENANCE, "test_dagger.py"], "survives")

# --- GCD's labels (3)
GL = "src/agentrl/gcd/labels.py"
m("gcd: a judge's non-answer kept as a label", GL,
  "                if verdict is not None:\n", "                if True:\n", GCD, "killed")
m("gcd: the bad steps chosen are the first ones, not a random draw", GL,
  "return rng.sample(good, k) + rng.sample(bad, k)", "return rng.sample(good, k) + bad[:k]", GCD, "survives")
m("gcd: the external judge asked about steps the rules already labelled", GL,
  "for i in range(len(traj.steps))\n                          if (t, i) not in labelled]",
  "for i in range(len(traj.steps))]", GCD, "killed")

# --- the coupling lab (2)
CL = "src/agentrl/analysis/coupling.py"
m("coupling: the influence matrix transposed (rows the measured sample)", CL,
  "matrix[i] = (after - before).cpu()", "matrix[:, i] = (after - before).cpu()", ["test_analysis.py"],
  "survives")
m("coupling: the out-of-domain sets drawn from the in-domain trajectories", CL,
  'sets["pos_ood"], sets["neg_ood"] = labelled_pairs(out_of_domain, samples, seed)',
  'sets["pos_ood"], sets["neg_ood"] = labelled_pairs(in_domain, samples, seed)', ["test_analysis.py", "test_cli.py"],
  "survives")

# --- the sampler-actor gap (1)
m("sampler gap: KL(sampler || actor) summed over tokens, not per token", "src/agentrl/losses/step.py",
  '"rollout/kl_sampler_actor": tally.counts.pop("check/k3") / n}', '"rollout/kl_sampler_actor": tally.counts.pop("check/k3")}',
  ["test_metrics.py", "test_trainer.py"], "survives")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--root", type=Path, required=True)
    parser.add_argument("--only", default="")
    parser.add_argument("--timeout", type=int, default=1200)
    args = parser.parse_args()
    for mutant, prediction in P:
        if args.only not in mutant.name:
            continue
        status, seconds, detail = run(mutant, args.root.resolve(), args.timeout)
        print(f"{status:>10}  {seconds:6.0f} s  predicted {prediction:8}  {mutant.name}  {detail}", flush=True)


if __name__ == "__main__":
    main()
