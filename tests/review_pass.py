"""Reviewer's pass 29 (issue 45): single breakages written apart from the suite, each with the
verdict predicted before the run, on features the issue names: what decides a phase's reuse
(provenance), the environment pool's deadlines and faults, GCD's labels, votes, critiques and
correction, and the gradient-coupling lab. Run on a clone:
    PYTEST_ADDOPTS="-n 2" .venv/bin/python tests/review_pass.py --root ../pass
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mutants import MUTANTS, Mutant, run  # noqa: E402

PROV = "src/agentrl/provenance.py"
POOL = "src/agentrl/envs/pool.py"
LABELS = "src/agentrl/gcd/labels.py"
JUDGE = "src/agentrl/gcd/judge.py"
CORRECTION = "src/agentrl/gcd/correction.py"
COUPLING = "src/agentrl/analysis/coupling.py"
REUSE = ["test_cli.py", "test_plugins.py", "test_settings.py", "test_failures.py"]
POOLS = ["test_pool.py"]
GCD = ["test_gcd.py"]
LAB = ["test_analysis.py", "test_trainer.py"]

# (mutant, predicted verdict)
PASS = [
    (Mutant("provenance: a nested setting flattened under its last name only", PROV,
            'out.update(flatten(value, f"{prefix}.{key}" if prefix else str(key)))',
            "out.update(flatten(value, str(key)))", REUSE), "killed"),
    (Mutant("provenance: a phase's record written before the phase is done", PROV,
            "        self.done[name] = settings\n        self._write()",
            "        self.done[name] = settings", REUSE), "killed"),
    (Mutant("pool: answers that arrived as the caller's wait ran out held back", POOL,
            "if wait_until is not None and now >= wait_until and not self._arrived:",
            "if wait_until is not None and now >= wait_until:", POOLS), "survived"),
    (Mutant("pool: the time limit named with the wrong setting", POOL,
            "f\"time limit (rl.env_pool.{TIME_LIMITS[command]} = {self.timeouts[command]:g} each)\")",
            "f\"time limit (rl.env_pool.step_timeout_s = {self.timeouts[command]:g} each)\")", POOLS), "survived"),
    (Mutant("gcd judge: a critique cut at the first <think> of an unclosed one", JUDGE,
            'end = text.find("</think>", start + 7) if start >= 0 else -1',
            'end = text.find("</think>") if start >= 0 else -1', GCD), "survived"),
    (Mutant("coupling lab: the mean gradient summed, not averaged", COUPLING,
            "return total / max(len(pairs), 1)", "return total", LAB), "survived"),
    (Mutant("provenance: a reused phase said to be running", PROV,
            'self.say(f"{name}: done earlier with the same settings, reused")', 'self.say(f"{name}: running")',
            REUSE), "survived"),
    (Mutant("provenance: a changed phase's message lists every change", PROV,
            'shown = "; ".join(diff[:4]) + (f"; and {len(diff) - 4} more" if len(diff) > 4 else "")',
            'shown = "; ".join(diff)', REUSE), "survived"),
    (Mutant("pool: a worker dying mid-message not counted as exiting (start failures never seen)", POOL,
            "self._fail(worker, f\"exited during a {command} ({self.transport.dead(worker) or 'its actor died'})\")",
            "self._fail(worker, f\"died during a {command} ({self.transport.dead(worker) or 'its actor died'})\")",
            POOLS), "killed"),
    (Mutant("pool: an environment's own error swallowed", POOL,
            "                if status == \"error\":\n                    errors.append(payload)",
            "                if status == \"error\":\n                    pass", POOLS), "killed"),
    (Mutant("pool: tentative actions stepped for real", POOL,
            '("try", tried))', '("step", tried))', POOLS), "killed"),
    (Mutant("gcd labels: the step before the last never labelled by the loop rule", LABELS,
            "for i in range(len(traj.steps) - 1):", "for i in range(len(traj.steps) - 2):", GCD), "survived"),
    (Mutant("gcd labels: the balanced selection takes up to n of each class", LABELS,
            "k = min(n // 2, len(good), len(bad))", "k = min(n, len(good), len(bad))", GCD), "killed"),
    (Mutant("gcd labels: labelled steps in the order their sources found them", LABELS,
            "return [labelled[key] for key in sorted(labelled)]", "return list(labelled.values())", GCD), "survived"),
    (Mutant("gcd judge: without full history the judge is asked about the episode's first step", JUDGE,
            'return [{"role": "user", "content": judge_prompt(steps[-1])}]',
            'return [{"role": "user", "content": judge_prompt(steps[0])}]', GCD), "killed"),
    (Mutant("gcd judge: a judgment's target verdict written inverted", JUDGE,
            'word = "good" if label else "bad"', 'word = "bad" if label else "good"', GCD), "killed"),
    (Mutant("gcd judge: the endpoint's backoff not doubled", JUDGE,
            "time.sleep(self.backoff_s * 2 ** attempt)", "time.sleep(self.backoff_s)", GCD), "survived"),
    (Mutant("gcd judge: a reply with an empty choices list accepted", JUDGE,
            "if not isinstance(choices, list) or not choices:", "if not isinstance(choices, list):", GCD), "survived"),
    (Mutant("gcd judge: answers counted per step, not per answer", JUDGE,
            '"answers": sum(map(len, received))', '"answers": len(received)', GCD), "survived"),
    (Mutant("coupling lab: the bad samples taken as good ones too", COUPLING,
            "bad = [Pair(x.step.prompt, x.step.response, False) for x in labelled if not x.label][:n]",
            "bad = [Pair(x.step.prompt, x.step.response, False) for x in labelled if x.label][:n]", LAB), "killed"),
    (Mutant("coupling lab: within-class similarity averaged over the empty class as 1", COUPLING,
            '"cos_within_class": statistics.fmean(within) if within else 0.0,',
            '"cos_within_class": statistics.fmean(within) if within else 1.0,', LAB), "survived"),

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
