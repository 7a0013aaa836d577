"""A reviewer's pass waiting for its run (the tenth, written in session 63): breakages of the
families issue 45 names where the ninth pass found survivors (what decides reuse, the pool's
deadlines, the testbed's knobs) and of compare, written from the source and not the tests, each
checked against every mutant's snippet (none breaks a line the table breaks the same way), each
with the verdict predicted before any run (committed before the run so that the predictions
cannot follow the results). Most lines of these files are already broken by a mutant in the
table, so the pass is small. Run it on a clone, never on a checkout a training run is using:

    git clone -q . ../pass && ln -s $PWD/.venv ../pass/.venv && .venv/bin/python tests/review_pass.py --root ../pass [--only TEXT]

Once run, the results go to docs/tests.md, each survivor gets a test, the breakages join
`mutants.py`, and this file goes.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mutants import COMPARE, PROVENANCE, TESTBED, Mutant, run  # noqa: E402

P: list[tuple[Mutant, str]] = []
"""Each breakage with its predicted verdict."""


def m(name: str, path: str, old: str, new: str, tests: list[str], prediction: str) -> None:
    P.append((Mutant(name, path, old, new, tests), prediction))


# --- the pool's deadlines (2)
PO = "src/agentrl/envs/pool.py"
m("pool: receive(timeout) waits past its timeout until a worker's deadline", PO,
  "until = min([self._deadline(w) for w in busy] + ([wait_until] if wait_until is not None else []))",
  "until = min([self._deadline(w) for w in busy])", ["test_pool.py", "test_rollout_modes.py"], "survives")
m("pool: a failed worker's queue kept for its replacement", PO,
  "            self._arrived.update({slot: None for slot in slots})\n        self._queue[worker].clear()",
  "            self._arrived.update({slot: None for slot in slots})", ["test_pool.py", "test_failures.py"], "killed")

# --- the testbed (4)
TB = "src/agentrl/envs/testbed/env.py"
m("testbed: an episode one step past its limit", TB,
  "done = success or failed or self.steps >= self.limit", "done = success or failed or self.steps > self.limit",
  TESTBED, "survives")
m("testbed: the key carried not shown", TB,
  '            if self.key:\n                parts.append(f"You carry the {self.key} key.")\n', "", TESTBED, "survives")
m("testbed: go back from the first room (to the last: the chest's room)", TB,
  'return actions + (["go back"] if self.room > 0 else [])', 'return actions + ["go back"]', TESTBED, "survives")
m("testbed: past the key room without a key, the expert walks on", TB,
  '            if self.room > c.key_room:\n                return "go back"',
  '            if self.room > c.key_room:\n                return f"go through {c.rooms[self.room][1]} door"',
  [*TESTBED, "test_dagger.py"], "survives")

# --- what decides reuse (1)
m("pipeline: an evaluation reused after a prompt setting changed", "src/agentrl/pipeline.py",
  'config_settings(config, "seed", "env", "prompt", "eval", exclude=EVAL_GUARDS)',
  'config_settings(config, "seed", "env", "eval", exclude=EVAL_GUARDS)', PROVENANCE, "survives")

# --- compare (3)
C = "src/agentrl/compare.py"
m("compare: P(A>B) over every run of each method, not the paired seeds", C,
  "xs, ys = _rates([x for x, _ in pairs], split), _rates([y for _, y in pairs], split)",
  "xs, ys = _rates(a, split), _rates(b, split)", COMPARE, "survives")
m("compare: the splits of the first run compared, whether every run has them or not", C,
  "splits = [s for s in next(iter(methods.values()))[0].outcomes\n"
  "              if all(s in r.outcomes for runs in methods.values() for r in runs)]",
  "splits = list(next(iter(methods.values()))[0].outcomes)", COMPARE, "killed")
m("compare: a method's judge accuracy its first seed's", C,
  'out[split]["judge_accuracy"] = float(np.mean(judged))', 'out[split]["judge_accuracy"] = float(judged[0])',
  COMPARE, "killed")


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
