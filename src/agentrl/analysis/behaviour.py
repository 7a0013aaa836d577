"""Repeated actions: how often the agent repeats itself or loops, and how confident it is when it
does (the papers: repeated actions are taken with high confidence after RL)."""

from __future__ import annotations

import statistics

from agentrl.prompting import encode_prompt, parse_action
from agentrl.rollout.types import StepSample, Trajectory


def repetition_stats(trajectories: list[Trajectory]) -> dict[str, float]:
    """repeat_rate: steps whose action equals the previous one; loop_rate: steps that return to an
    observation already seen in the episode; both over all steps."""
    steps = repeats = loops = 0
    for t in trajectories:
        seen = set()
        for prev, step in zip([None, *t.steps], t.steps):
            steps += 1
            repeats += prev is not None and step.action is not None and step.action == prev.action
            loops += step.observation in seen
            seen.add(step.observation)
    return {"steps": steps, "repeat_rate": repeats / max(steps, 1), "loop_rate": loops / max(steps, 1)}


def action_confidence(sampler, tokenizer, trajectories: list[Trajectory], sampling, resamples: int,
                      max_steps: int, require_think: bool = True) -> dict[str, float]:
    """Consistency over `resamples` re-samples (the share that gives the recorded action) at
    repeated steps and at the other valid steps, up to `max_steps` of each kind, with the steps and
    the re-samples each share rests on."""
    kinds: dict[str, list[StepSample]] = {"repeated": [], "other": []}
    for t in trajectories:
        for prev, step in zip([None, *t.steps], t.steps):
            if step.action is None or not step.prompt:
                continue
            kind = "repeated" if prev is not None and prev.action == step.action else "other"
            if len(kinds[kind]) < max_steps:
                kinds[kind].append(step)
    out = {}
    for kind, steps in kinds.items():
        if not steps:
            continue
        prompts = [encode_prompt(tokenizer, s.prompt) for s in steps for _ in range(resamples)]
        texts = [tokenizer.decode(g.token_ids, skip_special_tokens=True) for g in sampler.generate(prompts, sampling)]
        same = [parse_action(text, require_think) == steps[i // resamples].action for i, text in enumerate(texts)]
        out[f"confidence_{kind}"] = statistics.fmean(same)
        out[f"steps_{kind}"] = len(steps)
        out[f"samples_{kind}"] = len(same)
    return out
