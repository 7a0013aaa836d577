"""Expert trajectories as a JSONL chat dataset (one line per environment step)."""

from __future__ import annotations

import json
import random
from pathlib import Path

from agentrl.config import ConfigError
from agentrl.envs.base import NoExpertMove, sample_tasks
from agentrl.progress import task
from agentrl.prompting import HistoryEntry, format_response, render_prompt
from agentrl.rollout.types import StepSample, Trajectory


def expert_episode(env, task_id: str, prompt, detours: float = 0.0, rng: random.Random | None = None,
                   keep_failed: bool = False) -> list[dict]:
    """The chat examples of one expert episode, or [] if the expert failed it (or, like ALFWorld's
    hand-coded agent, found no move) unless `keep_failed`.

    With `detours` > 0 (noise injection, as in DART, Laskey et al. 2017) each step executes a
    random admissible action instead of the expert's with that probability; the example still
    teaches the expert's action, so the data shows how to recover from states an error leads to.
    Such an episode keeps its examples up to the point where the expert can no longer win it."""
    obs = env.reset(task_id)
    history: list[HistoryEntry] = []
    examples = []
    visited: set[str] = set()
    detoured = False
    for step in range(env.max_steps):
        user = render_prompt(prompt.template, obs, history, step, prompt.history_length)
        try:
            thought, action = env.expert_action()
        except NoExpertMove:
            return examples if detoured or keep_failed else []
        tag = "think"
        if prompt.expert_tags == "meta":
            tag = "planning" if step == 0 else "explore" if _goes_somewhere_new(action, visited) else "monitor"
        examples.append({"task_id": task_id, "messages": [
            {"role": "user", "content": user},
            {"role": "assistant", "content": format_response(thought, action, tag)},
        ]})
        if detours and rng.random() < detours:
            action = rng.choice(obs.admissible_actions)
            detoured = True
        result = env.step(action)
        history.append(HistoryEntry(obs.text, action))
        obs = result.observation
        if result.done:
            return examples if result.success or detoured or keep_failed else []
    return examples if detoured or keep_failed else []


def _goes_somewhere_new(action: str, visited: set[str]) -> bool:
    if not action.startswith("go to "):
        return False
    new = action not in visited
    visited.add(action)
    return new


def collect_expert_data(env, prompt, episodes: int, path: str | Path, seed: int,
                        split: str = "train", detours: float = 0.0, keep_failed: bool = False) -> dict:
    """Write the successful expert episodes of `episodes` sampled tasks to `path` (with `detours`
    or `keep_failed`, see `expert_episode`, every episode's examples)."""
    rng = random.Random(seed)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    kept = steps = 0
    with path.open("w") as f, task("expert data", episodes) as advance:
        for task_id in sample_tasks(env, split, episodes, rng):
            advance()
            examples = expert_episode(env, task_id, prompt, detours, rng, keep_failed)
            kept += bool(examples)
            steps += len(examples)
            for example in examples:
                f.write(json.dumps(example) + "\n")
    return {"episodes": episodes, "successful": kept, "examples": steps}


def read_chat_dataset(path: str | Path) -> list[list[dict]]:
    """The `messages` of every line; a malformed line is an error naming the file and line."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"chat dataset {path} does not exist")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise ConfigError(f"chat dataset {path}: not UTF-8 text (byte {err.start})") from None
    conversations = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            messages = json.loads(line)["messages"]
            assert isinstance(messages, list) and all({"role", "content"} <= set(m) for m in messages)
        except (json.JSONDecodeError, KeyError, TypeError, AssertionError):
            raise ConfigError(f"{path}:{number}: expected a JSON object with 'messages': "
                             "[{'role': ..., 'content': ...}, ...]") from None
        conversations.append(messages)
    return conversations


def _play(env, task_id: str, prompt, policy) -> Trajectory:
    """One episode as a Trajectory of StepSamples (text only: no token ids)."""
    obs = env.reset(task_id)
    traj = Trajectory(task_id=task_id, group_id=0, task_type=env.task_type(task_id))
    history: list[HistoryEntry] = []
    for step in range(env.max_steps):
        text = render_prompt(prompt.template, obs, history, step, prompt.history_length)
        action = policy(obs)
        result = env.step(action)
        traj.steps.append(StepSample([], [], [], response=action, action=action, observation=obs.text,
                                     anchor=obs.anchor, reward=result.reward, prompt=text,
                                     progress=result.progress))
        history.append(HistoryEntry(obs.text, action))
        obs = result.observation
        if result.done:
            traj.success = result.success
            break
    return traj


def collect_judgment_data(env, prompt, examples: int, path: str | Path, seed: int, labels=("rules", "env")) -> dict:
    """Append `examples` judgment examples (GCD cold start), half good and half bad: good ones
    are expert moves, bad ones are steps of a random-action policy that the label sources call
    bad. Each answer is the response a perfect judge would give."""
    from agentrl.gcd.judge import judge_prompt, judgment_response
    from agentrl.gcd.labels import label_steps

    rng = random.Random(seed)
    good, bad = [], []
    for task_id in sample_tasks(env, "train", 10 * examples, rng):
        if len(good) >= examples // 2 and len(bad) >= examples - examples // 2:
            break
        if len(good) < examples // 2:
            good += [(s, True, "it makes progress")
                     for s in _play(env, task_id, prompt, lambda obs: env.expert_action()[1]).steps]
        else:
            traj = _play(env, task_id, prompt, lambda obs: rng.choice(obs.admissible_actions))
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
