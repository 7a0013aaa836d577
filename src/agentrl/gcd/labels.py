"""Action labels for GCD: which (state, action) pairs were good (True) or bad (False).

Sources, tried in the configured order (the first that labels a step wins):
- rules: an action whose resulting observation re-occurs later in the trajectory is bad (it led
  into a loop or changed nothing); the last step of a successful trajectory is good.
- env: the environment's own judgement (`StepSample.progress`), where it has one; the built-in
  household environment's expert knows which moves make progress.
- llm: an external LLM judge (see `agentrl.gcd.judge.ExternalJudge`), asked only about steps the
  earlier sources left unlabelled.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass

from agentrl.gcd.judge import judge_messages
from agentrl.rollout.types import StepSample, Trajectory


@dataclass
class LabeledStep:
    step: StepSample
    label: bool
    source: str
    reason: str
    """Why, in words (used as the critique in judgment SFT data)."""


def rule_labels(traj: Trajectory) -> dict[int, tuple[bool, str]]:
    """{step index: (label, reason)} by the two rules above. Step i's result is the observation
    of step i + 1, so the last step's result is unknown (only the success rule applies)."""
    observations = [s.observation for s in traj.steps]
    labels = {}
    for i in range(len(traj.steps) - 1):
        if observations[i + 1] in observations[i + 2:]:
            labels[i] = (False, "it leads to a state seen again later")
    if traj.success and traj.steps:
        labels[len(traj.steps) - 1] = (True, "it completes the task")
    return labels


def env_labels(traj: Trajectory) -> dict[int, tuple[bool, str]]:
    return {i: (s.progress, "it makes progress" if s.progress else "it cannot help")
            for i, s in enumerate(traj.steps) if s.progress is not None}


def label_steps(trajectories: list[Trajectory], sources: list[str], external=None,
                external_budget: int = 0, rng: random.Random | None = None,
                full_history: bool = False) -> list[LabeledStep]:
    """Every labelled step of `trajectories`, in trajectory order; `full_history`: the external
    judge is sent each step's episode so far as a conversation (`judge_messages`)."""
    labelled: dict[tuple[int, int], LabeledStep] = {}
    for source in sources:
        if source == "llm":
            unlabelled = [(t, i) for t, traj in enumerate(trajectories) for i in range(len(traj.steps))
                          if (t, i) not in labelled]
            if external is None or not unlabelled:
                continue
            chosen = (rng or random.Random(0)).sample(unlabelled, min(external_budget, len(unlabelled)))
            verdicts = external.label([judge_messages(trajectories[t].steps[:i + 1], full_history) for t, i in chosen])
            for (t, i), verdict in zip(chosen, verdicts):
                if verdict is not None:
                    labelled[(t, i)] = LabeledStep(trajectories[t].steps[i], verdict, "llm",
                                                   "the external judge says so")
            continue
        rule = {"rules": rule_labels, "env": env_labels}[source]
        for t, traj in enumerate(trajectories):
            for i, (label, reason) in rule(traj).items():
                labelled.setdefault((t, i), LabeledStep(traj.steps[i], label, source, reason))
    return [labelled[key] for key in sorted(labelled)]


def balanced_selection(labelled: list[LabeledStep], n: int, rng: random.Random) -> list[LabeledStep]:
    """Up to n // 2 positives and as many negatives (equal counts: with only one class present the
    judge would learn to always give that verdict, so nothing is selected)."""
    good = [x for x in labelled if x.label]
    bad = [x for x in labelled if not x.label]
    k = min(n // 2, len(good), len(bad))
    return rng.sample(good, k) + rng.sample(bad, k)


def label_counts(labelled: list[LabeledStep]) -> dict[str, float]:
    counts = Counter((x.source, x.label) for x in labelled)
    return {f"labels/{source}_{'good' if label else 'bad'}": float(c) for (source, label), c in counts.items()}
