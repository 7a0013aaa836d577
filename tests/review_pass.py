"""A reviewer's pass waiting for its run (the ninth, written in session 62): breakages of the
features issue 45 names, written from the source and not the tests, none like one in
`mutants.py`, each with the verdict predicted before any run (committed before the run so that
the predictions cannot follow the results). Run it on a clone, never on a checkout a training run
is using (each breakage edits the clone's source while its tests run):

    git clone -q . ../pass && ln -s $PWD/.venv ../pass/.venv && .venv/bin/python tests/review_pass.py --root ../pass [--only TEXT]

Once run, the results go to docs/tests.md, each survivor gets a test, the breakages join
`mutants.py`, and this file goes.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mutants import COMPARE, GCD, PROVENANCE, TESTBED, TRAINER, Mutant, run  # noqa: E402

P: list[tuple[Mutant, str]] = []
"""Each breakage with its predicted verdict."""


def m(name: str, path: str, old: str, new: str, tests: list[str], prediction: str) -> None:
    P.append((Mutant(name, path, old, new, tests), prediction))


S, C = "src/agentrl/stats.py", "src/agentrl/compare.py"
# --- compare and its statistics (8)
m("stats: the MDD at a one-sided 5% level", S,
  "quantiles = stats.t.ppf(1 - (1 - confidence) / 2, seeds - 1)", "quantiles = stats.t.ppf(confidence, seeds - 1)",
  COMPARE, "killed")
m("stats: the MDD's standard error over seeds - 1", S,
  "return float(quantiles * math.sqrt(variance / seeds))", "return float(quantiles * math.sqrt(variance / (seeds - 1)))",
  COMPARE, "killed")
m("stats: the bootstrap interval at 90%", S,
  "result = stats.bootstrap((values,), np.mean, confidence_level=confidence,",
  "result = stats.bootstrap((values,), np.mean, confidence_level=0.9,", COMPARE, "killed")
m("compare: seeds to detect 5 points sized in success's scale whatever the metric", C,
  '"5 points": stats.seeds_needed(parts, 5 * point)}', '"5 points": stats.seeds_needed(parts, 0.05)}',
  COMPARE, "survives")
m("compare: the per-method sd columns swapped (seeds / eval)", C,
  "f\"{_pts(m[s]['between_seeds_sd'])} / \"\n                 f\"{_pts(m[s]['within_eval_sd'])}\"",
  "f\"{_pts(m[s]['within_eval_sd'])} / \"\n                 f\"{_pts(m[s]['between_seeds_sd'])}\"", COMPARE, "survives")
m("compare: an MDD reported where no spread was measured", C,
  "return mdd if parts.total_sd > 0 else None", "return mdd", COMPARE, "killed")
m("compare: P(A>B) of B over A", C,
  '"p_improvement": stats.probability_of_improvement(xs, ys),',
  '"p_improvement": stats.probability_of_improvement(ys, xs),', COMPARE, "killed")
m("compare: the MDD at 5/10/20 seeds all at the seeds run", C,
  "sized(stats.detectable_difference(parts, n)) for n in scale_seeds}",
  "sized(stats.detectable_difference(parts, len(diffs))) for n in scale_seeds}", COMPARE, "killed")

# --- what decides reuse (5)
PR, PL = "src/agentrl/provenance.py", "src/agentrl/pipeline.py"
m("provenance: a plugin package's other modules not hashed", PR,
  'files = sorted(source.parent.rglob("*.py")) if source.name == "__init__.py" else [source]',
  "files = [source]", PROVENANCE, "survives")
m("provenance: a setting the record has and the new settings lack not compared (a dropped plugin)", PR,
  "keys = sorted(set(old) | set(new))", "keys = sorted(set(new))", PROVENANCE, "survives")
m("pipeline: the RL evaluation reused after rl.steps grew", PL,
  'plan["eval_settings"] = {**settings, "rl.steps": config.rl.steps,', 'plan["eval_settings"] = {**settings,',
  PROVENANCE, "killed")
m("pipeline: a given SFT data file edited in place not seen", PL,
  'data_settings = {"sft.data": str(data), "sft.data.fingerprint": _file_fingerprint(data)}',
  'data_settings = {"sft.data": str(data)}', PROVENANCE, "survives")
m("pipeline: DAgger's prompt settings not part of SFT's with given data", PL,
  'config_settings(config, "env", "prompt").items()})', 'config_settings(config, "env").items()})',
  [*PROVENANCE, "test_dagger.py"], "survives")

# --- the pool's deadlines (2)
PO = "src/agentrl/envs/pool.py"
m("pool: only the first busy worker checked against its deadline", PO,
  "            for worker in busy:\n                if self._queue[worker] and now >= self._deadline(worker):",
  "            for worker in busy[:1]:\n                if self._queue[worker] and now >= self._deadline(worker):",
  ["test_pool.py", "test_failures.py"], "survives")
m("pool: an expert question timed by the reset limit", PO,
  '"expert": "step_timeout_s"}', '"expert": "reset_timeout_s"}', ["test_pool.py", "test_dagger.py"], "survives")

# --- the testbed's knobs (4)
TB = "src/agentrl/envs/testbed/env.py"
m("testbed: the step budget without L2's extra rooms", TB,
  "self.max_steps = self.config.horizon + self.config.l2_extra_rooms + self.config.slack + 1",
  "self.max_steps = self.config.horizon + self.config.slack + 1", TESTBED, "survives")
m("testbed: L1's corridors longer too", TB,
  'horizon += l2_extra_rooms if split == "l2" else 0', 'horizon += l2_extra_rooms if split in ("l1", "l2") else 0',
  TESTBED, "killed")
m("testbed: a key can be swapped after taking one", TB,
  "if self.room == self.corridor.key_room and self.key is None:\n            actions +=",
  "if self.room == self.corridor.key_room:\n            actions +=", TESTBED, "survives")
m("testbed: the anchor carries the step count (no state is ever revisited)", TB,
  "admissible_actions=self.admissible_actions(), anchor=text)",
  'admissible_actions=self.admissible_actions(), anchor=f"{text} ({self.steps})")', [*TESTBED, "test_advantages.py"],
  "survives")

# --- the sampler-actor gap (2)
TR, ST = "src/agentrl/trainer.py", "src/agentrl/losses/step.py"
m("gap: with actor old log-probs the in-update check runs too (the actor against itself)", TR,
  'step % rl.check_logprobs_every == 0 and rl.old_logprobs != "actor"', "step % rl.check_logprobs_every == 0",
  [*TRAINER, "test_overlap.py"], "killed")
m("gap: the mean |log ratio| summed with its sign", ST,
  '"check/diff": log_ratio.abs().sum()', '"check/diff": log_ratio.sum()', [*TRAINER, "test_actor.py"], "survives")

# --- the KL reference (1)
m("kl in reward: the estimator given the reference as the sampling policy", "src/agentrl/losses/reference.py",
  "self.kl(torch.tensor(s.old_logprobs), torch.tensor(s.ref_logprobs))",
  "self.kl(torch.tensor(s.ref_logprobs), torch.tensor(s.old_logprobs))", [*TRAINER], "killed")

# --- GCD labels (3)
GL = "src/agentrl/gcd/labels.py"
m("gcd rules: the step from a revisited state labelled, not the one leading into it", GL,
  "if observations[i + 1] in observations[i + 2:]:", "if observations[i] in observations[i + 1:]:",
  GCD, "killed")
m("gcd env labels: only the environment's good verdicts kept", GL,
  "for i, s in enumerate(traj.steps) if s.progress is not None}", "for i, s in enumerate(traj.steps) if s.progress}",
  GCD, "killed")
m("gcd: label counts name good as bad", GL,
  "{'good' if label else 'bad'}", "{'bad' if label else 'good'}", GCD, "survives")

# --- the coupling lab (2)
CP = "src/agentrl/analysis/coupling.py"
m("coupling: representation separation counts each sample with itself", CP,
  "for i, j in itertools.combinations(range(len(labels)), 2):\n        (within",
  "for i, j in itertools.product(range(len(labels)), repeat=2):\n        (within", ["test_analysis.py", "test_gcd.py"], "survives")
m("coupling: a response's log-prob averaged over its tokens, not summed", CP,
  "ids[0, n_prompt:, None]).sum()", "ids[0, n_prompt:, None]).mean()", ["test_analysis.py", "test_gcd.py"], "survives")

# --- an estimator (1)
m("rloo: the baseline divides the others' total by K", "src/agentrl/advantages/rloo.py",
  "(total - t.episode_reward) / (k - 1) if k > 1", "(total - t.episode_reward) / k if k > 1",
  ["test_advantages.py", "test_direction.py"], "killed")


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
