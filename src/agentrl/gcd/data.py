"""GCD's cold-start data: judgment examples mixed into the SFT data (`sft.judgments`)."""

from __future__ import annotations

import json
import random
from pathlib import Path

from agentrl.data import play
from agentrl.envs.base import sample_tasks
from agentrl.gcd.judge import judge_prompt, judgment_response
from agentrl.gcd.labels import label_steps


def collect_judgment_data(env, prompt, examples: int, path: str | Path, seed: int, labels=("rules", "env")) -> dict:
    """Append `examples` judgment examples (GCD cold start), half good and half bad: good ones
    are expert moves, bad ones are steps of a random-action policy that the label sources call
    bad. Each answer is the response a perfect judge would give."""
    rng = random.Random(seed)
    good, bad = [], []
    for task_id in sample_tasks(env, "train", 10 * examples, rng):
        if len(good) >= examples // 2 and len(bad) >= examples - examples // 2:
            break
        if len(good) < examples // 2:
            good += [(s, True, "it makes progress")
                     for s in play(env, task_id, prompt, lambda obs: env.expert_action()[1]).steps]
        else:
            traj = play(env, task_id, prompt, lambda obs: rng.choice(obs.admissible_actions))
            bad += [(x.step, False, x.reason) for x in label_steps([traj], list(labels)) if not x.label]
    chosen = rng.sample(good, min(len(good), examples // 2)) + rng.sample(bad, min(len(bad), examples - examples // 2))
    rng.shuffle(chosen)
    with Path(path).open("a") as f:
        for step, label, reason in chosen:
            f.write(json.dumps({"task_id": "judgment", "messages": [
                {"role": "user", "content": judge_prompt(step)},
                {"role": "assistant", "content": judgment_response(label, reason)}]}) + "\n")
    n_good = sum(label for _, label, _ in chosen)
    return {"judgments": len(chosen), "good": n_good, "bad": len(chosen) - n_good}
