"""A reviewer's pass waiting for its run (the fourteenth, written in session 67): breakages on
issue 45's families that the thirteenth left alone (evaluation's summary of aborted episodes, the
GCD judge's parsing, vote and endpoint, the rollout's abort and progress bookkeeping, compare's
reading of a judge's accuracy, the pool's idle deaths), each on a line no mutant in the table
breaks, written from the source and not the tests, each with the verdict predicted before any run
(committed before the run so that the predictions cannot follow the results). Run it on a clone,
never on a checkout a training run is using:

    git clone -q . ../pass && ln -s $PWD/.venv ../pass/.venv && PYTEST_ADDOPTS="-n 2" .venv/bin/python tests/review_pass.py --root ../pass

Once run, the results go to docs/tests.md, each survivor gets a test, the breakages join
`mutants.py`, and this file goes.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mutants import COMPARE, EVAL, FAILURES, GCD, ROLLOUT, TRAINER, Mutant, run  # noqa: E402

P: list[tuple[Mutant, str]] = []
"""Each breakage with its predicted verdict."""


def m(name: str, path: str, old: str, new: str, tests: list[str], prediction: str) -> None:
    P.append((Mutant(name, path, old, new, tests), prediction))


# --- evaluation's summary (4)
E = "src/agentrl/evaluate.py"
m("eval: the mean episode length taken over aborted episodes too", E,
  '"mean_length": len(steps) / max(n, 1)', '"mean_length": len(steps) / max(n + aborted, 1)',
  [*EVAL, *COMPARE, "test_failures.py"], "survives")
m("eval: a task type's success taken as a share of every episode", E,
  "k: sum(v) / len(v) for k, v in sorted(by_type.items())", "k: sum(v) / n for k, v in sorted(by_type.items())",
  [*EVAL, "test_alfworld.py", "test_scienceworld.py"], "survives")
m("eval: the last tasks of each split played, not the first", E,
  "tasks = pool.local.split_tasks(split)[:eval_cfg.episodes]", "tasks = pool.local.split_tasks(split)[-eval_cfg.episodes:]",
  [*EVAL, *COMPARE, "test_alfworld.py"], "killed")
m("eval: the components' measures drawn with seed 0 whatever the run's", E,
  "results[split].update(component.evaluate(trajectories, seed))",
  "results[split].update(component.evaluate(trajectories, 0))", [*EVAL, *GCD], "survives")

# --- the GCD judge (5)
J = "src/agentrl/gcd/judge.py"
m("judge: a verdict tag in capitals read as bad", J,
  "verdicts = {m.lower() for m in _VERDICT.findall(text)}", "verdicts = set(_VERDICT.findall(text))", GCD, "survives")
m("judge: unparseable answers can win the vote", J,
  "counts = Counter(v for v in verdicts if v is not None)", "counts = Counter(verdicts)", GCD, "survives")
m("endpoint: one attempt fewer than retries + 1", J,
  "for attempt in range(self.retries + 1):", "for attempt in range(max(self.retries, 1)):", GCD, "killed")
m("endpoint: the API key never sent", J,
  '            headers["Authorization"] = f"Bearer {key}"', "            pass", GCD, "survives")
m("judge: the failed requests counted per call, not over the run", J,
  "self.errors += len(failures)", "self.errors = len(failures)", GCD, "survives")

# --- the rollout's bookkeeping (3)
CO = "src/agentrl/rollout/collect.py"
m("rollout: a worker failure mid-episode counted as the episode's failure, not an abort", CO,
  "            e.trajectory.aborted = True\n            return False", "            return False",
  [*ROLLOUT, *FAILURES, *EVAL], "killed")
m("rollout: a step's progress flag dropped", CO,
  "sample.reward, sample.progress = result.reward, result.progress", "sample.reward = result.reward",
  [*ROLLOUT, *GCD, "test_testbed.py"], "killed")
m("rollout: group ids restart in every batch of tasks", CO,
  "group_id=first_group_id + t,", "group_id=t,", [*ROLLOUT, *EVAL, *COMPARE, "test_distributed.py"], "survives")

# --- compare (1)
m("compare: a method's judge accuracy never read from its evaluations", "src/agentrl/compare.py",
  'extras[split] = {k: v for k, v in result.items() if k == "judge_accuracy"}', "extras[split] = {}",
  [*COMPARE, *GCD], "survives")

# --- the pool (1)
m("pool: a process worker that died while idle never seen as dead", "src/agentrl/envs/pool.py",
  'return None if proc.is_alive() else f"exit code {proc.exitcode}"', "return None",
  ["test_pool.py", *FAILURES, *TRAINER], "killed")


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
