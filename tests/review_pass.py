"""A reviewer's pass waiting for its run (the fifteenth, written in session 67): breakages of the
numbers DAgger's rounds, the behaviour analysis, compare's report and GCD's correction and judge
chats publish, each on a line no mutant in the table breaks, written from the source and not the
tests, each with the verdict predicted before any run (committed before the run so that the
predictions cannot follow the results). Run it on a clone, never on a checkout a training run is
using:

    git clone -q . ../pass && ln -s $PWD/.venv ../pass/.venv && PYTEST_ADDOPTS="-n 2" .venv/bin/python tests/review_pass.py --root ../pass

Once run, the results go to docs/tests.md, each survivor gets a test, the breakages join
`mutants.py`, and this file goes.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mutants import COMPARE, GCD, Mutant, run  # noqa: E402

P: list[tuple[Mutant, str]] = []
"""Each breakage with its predicted verdict."""


def m(name: str, path: str, old: str, new: str, tests: list[str], prediction: str) -> None:
    P.append((Mutant(name, path, old, new, tests), prediction))


D = "src/agentrl/dagger.py"
DAGGER = ["test_dagger.py", "test_cli.py", "test_full_history.py"]
m("dagger: a round's success taken over its aborted episodes too", D,
  "success=sum(t.success for t in played) / max(len(played), 1)",
  "success=sum(t.success for t in played) / max(len(self.trajectories), 1)", [*DAGGER, "test_failures.py"], "survives")
m("dagger: the policy agreement taken per episode, not per labelled state", D,
  "policy_agreement=self.agreed / max(len(self.examples), 1)", "policy_agreement=self.agreed / max(len(played), 1)",
  DAGGER, "survives")
m("dagger: the rounds play the l0 evaluation tasks, not train tasks", D,
  'tasks = sample_tasks(pool.local, "train", dagger.episodes, rng)',
  'tasks = sample_tasks(pool.local, "l0", dagger.episodes, rng)', DAGGER, "survives")
m("behaviour: a return to a state seen earlier in the episode never counted as a loop", "src/agentrl/analysis/behaviour.py",
  "            seen.add(step.observation)", "            pass", ["test_analysis.py", "test_cli.py"], "killed")
m("compare: 'A better' out of the seeds that were not tied", "src/agentrl/compare.py",
  "f\"{r['seeds_a_better']}/{len(p['seeds'])} | ", "f\"{r['seeds_a_better']}/{len(p['seeds']) - r['seeds_tied']} | ",
  COMPARE, "killed")
C = "src/agentrl/gcd/correction.py"
m("correction: the summary asked without the actions the critiques are about", C,
  'listing = "\\n".join(f"- {action}: {text}" for action, text in recent)',
  'listing = "\\n".join(f"- {text}" for action, text in recent)', GCD, "survives")
m("correction: an empty summary becomes a bare header as the hint", C,
  'self.hint = f"{HEADER}\\n{summary.strip()}" if summary.strip() else ""', 'self.hint = f"{HEADER}\\n{summary.strip()}"',
  GCD, "survives")
m("judge: a full-history chat shows the actions played, not the replies", "src/agentrl/gcd/judge.py",
  '{"role": "assistant", "content": s.response})]', '{"role": "assistant", "content": s.action})]',
  [*GCD, "test_full_history.py"], "killed")


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
