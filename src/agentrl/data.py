"""Expert trajectories as a JSONL chat dataset (one line per environment step)."""

from __future__ import annotations

import json
import random
from pathlib import Path

from agentrl.prompting import HistoryEntry, format_response, render_prompt


def expert_episode(env, task_id: str, prompt) -> list[dict]:
    """The chat examples of one expert episode, or [] if the expert failed it."""
    obs = env.reset(task_id)
    history: list[HistoryEntry] = []
    examples = []
    for step in range(env.max_steps):
        user = render_prompt(prompt.template, obs, history, step, prompt.history_length)
        thought, action = env.expert_action()
        examples.append({"task_id": task_id, "messages": [
            {"role": "user", "content": user},
            {"role": "assistant", "content": format_response(thought, action)},
        ]})
        result = env.step(action)
        history.append(HistoryEntry(obs.text, action))
        obs = result.observation
        if result.done:
            return examples if result.success else []
    return []


def collect_expert_data(env, prompt, episodes: int, path: str | Path, seed: int,
                        split: str = "train") -> dict:
    """Write the successful expert episodes of `episodes` sampled tasks to `path`."""
    rng = random.Random(seed)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    kept = steps = 0
    with path.open("w") as f:
        for task_id in env.sample_tasks(split, episodes, rng):
            examples = expert_episode(env, task_id, prompt)
            kept += bool(examples)
            steps += len(examples)
            for example in examples:
                f.write(json.dumps(example) + "\n")
    return {"episodes": episodes, "successful": kept, "examples": steps}


def read_chat_dataset(path: str | Path) -> list[list[dict]]:
    """The `messages` of every line; a malformed line is an error naming the file and line."""
    conversations = []
    for number, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            messages = json.loads(line)["messages"]
            assert isinstance(messages, list) and all({"role", "content"} <= set(m) for m in messages)
        except (json.JSONDecodeError, KeyError, TypeError, AssertionError):
            raise ValueError(f"{path}:{number}: expected a JSON object with 'messages': "
                             "[{'role': ..., 'content': ...}, ...]") from None
        conversations.append(messages)
    return conversations
