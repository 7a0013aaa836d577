"""A reviewer's pass waiting for its run (the thirteenth, written in session 67): breakages kept
to issue 45's own families (compare's statistics, what decides a phase's reuse, the pool's
faults, the testbed's knobs, the KL reference, GCD's labels and judge, the coupling lab, the loss
weights and the sampler check), each on a line no mutant in the table breaks, written from the
source and not the tests, each with the verdict predicted before any run (committed before the
run so that the predictions cannot follow the results). Run it on a clone, never on a checkout a
training run is using:

    git clone -q . ../pass && ln -s $PWD/.venv ../pass/.venv && .venv/bin/python tests/review_pass.py --root ../pass [--only TEXT]

Once run, the results go to docs/tests.md, each survivor gets a test, the breakages join
`mutants.py`, and this file goes.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mutants import COMPARE, FAILURES, GCD, PROVENANCE, TESTBED, TRAINER, Mutant, run  # noqa: E402

P: list[tuple[Mutant, str]] = []
"""Each breakage with its predicted verdict."""


def m(name: str, path: str, old: str, new: str, tests: list[str], prediction: str) -> None:
    P.append((Mutant(name, path, old, new, tests), prediction))


# --- compare's statistics (3)
ST, C = "src/agentrl/stats.py", "src/agentrl/compare.py"
m("stats: a tie counted as a win in P(A>B) (and again as half)", ST,
  "return ((a[..., :, None] > b[..., None, :])", "return ((a[..., :, None] >= b[..., None, :])",
  [*COMPARE, "test_analysis.py"], "killed")
m("stats: the MDD at more evaluation episodes sized at the measured count", ST,
  "episodes = episodes or parts.episodes", "episodes = parts.episodes", [*COMPARE, "test_analysis.py"], "survives")
m("compare: the paired difference taken over every task each run played, not the tasks in common", C,
  "mean = float(np.mean(diffs))", "mean = float(np.mean(xs) - np.mean(ys))", [*COMPARE, "test_cli.py"], "survives")

# --- what decides a phase's reuse (4)
m("reuse: a model folder's fingerprint blind to files rewritten at the same size", "src/agentrl/provenance.py",
  '{stat.st_size}:{stat.st_mtime_ns}', "{stat.st_size}", [*PROVENANCE, "test_dagger.py", "test_sft.py"], "survives")
m("reuse: `agentrl data` hands out expert data made with another number of judgments", "src/agentrl/pipeline.py",
  '"episodes": episodes, "judgments": judgments,', '"episodes": episodes,', [*PROVENANCE, "test_gcd.py"], "survives")
m("reuse: the pipeline's expert data kept when sft.judgments changed", "src/agentrl/pipeline.py",
  'config_settings(config, "sft.episodes", "sft.judgments",', 'config_settings(config, "sft.episodes",',
  [*PROVENANCE, "test_gcd.py"], "killed")
m("reuse: a DAgger round's SFT kept when its labels changed", "src/agentrl/pipeline.py",
  ', "dagger.labels": played}', "}", [*PROVENANCE, "test_dagger.py"], "survives")

# --- the pool's faults (1)
m("pool: a worker process dies on the Ctrl-C meant for the main process", "src/agentrl/envs/pool.py",
  "    signal.signal(signal.SIGINT, signal.SIG_IGN)", "    pass", ["test_pool.py", *FAILURES], "survives")

# --- the testbed's knobs (2)
TB = "src/agentrl/envs/testbed/env.py"
m("testbed: every corridor one task type (balance and per-type success see one kind)", TB,
  'return f"corridor_{len(make_corridor(self.config, task_id).rooms)}"', 'return "corridor"',
  [*TESTBED, "test_trainer.py"], "survives")
m("testbed: the expert plays on holding the wrong key (DAgger labels a lost state)", TB,
  "if self.key is not None and self.key != key:", "if False:", [*TESTBED, "test_dagger.py", "test_gcd.py"],
  "survives")

# --- the KL reference (2)
m("kl: the reference scored at temperature 1 whatever the sampler's", "src/agentrl/losses/reference.py",
  "config.sampling.temperature or 1.0", "1.0", [*TRAINER, "test_actor.py"], "survives")
m("kl: k1's log-ratio taken the other way", "src/agentrl/losses/policy.py",
  "    return logp - ref_logp", "    return ref_logp - logp", [*TRAINER, "test_actor.py"], "killed")

# --- GCD (2)
m("gcd classifier: trained on the inverted labels", "src/agentrl/gcd/loss.py",
  "target=[float(labelled.label)]", "target=[float(not labelled.label)]", GCD, "killed")
m("gcd: the external judge's per-step counts add up over steps", "src/agentrl/gcd/loss.py",
  "        judge.external.counts = dict.fromkeys(judge.external.counts, 0)", "        pass", GCD, "survives")

# --- the coupling lab (2)
CL = "src/agentrl/analysis/coupling.py"
m("coupling: representations normalised across samples, not per sample", CL,
  "normed = F.normalize(reps, dim=-1)", "normed = F.normalize(reps, dim=0)", ["test_analysis.py", *GCD], "survives")
m("coupling: the report's influence matrix twice the size asked", CL,
  "k = min(influence_pairs // 2, len(good_id), len(bad_id))", "k = min(influence_pairs, len(good_id), len(bad_id))",
  ["test_analysis.py", "test_cli.py"], "survives")

# --- loss weights and the sampler check (2)
m("loss: seq-mean-token-sum divides by the rank's own sequences", "src/agentrl/losses/policy.py",
  "return [1.0 / n_seqs] * len(lengths)", "return [1.0 / len(lengths)] * len(lengths)",
  [*TRAINER, "test_actor.py", "test_distributed.py"], "survives")
m("check: the sampler-actor KL measured with the log-ratio reversed", "src/agentrl/losses/step.py",
  "sampler_check(logp - batch.old_logprobs)", "sampler_check(batch.old_logprobs - logp)",
  [*TRAINER, "test_actor.py", "test_overlap.py"], "survives")


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
