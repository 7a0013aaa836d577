"""Per-step prompts and the response parser.

A step's prompt is built from the state alone: the task, the last `history_length`
(observation, action) pairs, the current observation, the admissible actions and, where the
environment keeps one, its record of the episode (`{memory}`). The response
is `<think>...</think><action>...</action>`; the action is the first `<action>` tag's text,
lower-cased with white space folded. RLVMR's meta-reasoning tags (`<planning>`, `<explore>`,
`<reflection>`, `<monitor>`) count as the reasoning block in place of `<think>`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel

from agentrl.files import write_atomic

if TYPE_CHECKING:
    from agentrl.envs.base import Observation

def encode_prompt(tokenizer, text: str) -> list[int]:
    """The token ids of `text` as one user turn in the tokenizer's chat template, the assistant's
    turn opened (what the sampler is given)."""
    chat = tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                         add_generation_prompt=True)
    return tokenizer(chat, add_special_tokens=False).input_ids


DEFAULT_TEMPLATE = (
    "You are an agent in a household. Your task is to: {task}\n"
    "You have taken {step} step(s). Recent history:\n{history}\n"
    "Current observation: {observation}\n"
    "Admissible actions: {actions}\n"
    "Think briefly inside <think> </think>, then give one admissible action inside "
    "<action> </action>."
)
TEMPLATE_FIELDS = ("task", "step", "history", "observation", "actions", "memory")
META_TAGS = ("planning", "explore", "reflection", "monitor")
REASONING_TAGS = ("think", *META_TAGS)


@dataclass
class HistoryEntry:
    observation: str
    action: str


def render_prompt(template: str, obs: Observation, history: list[HistoryEntry], step: int,
                  history_length: int) -> str:
    recent = history[-history_length:] if history_length > 0 else []
    lines = [f"Observation: {h.observation}\nAction: {h.action}" for h in recent]
    return template.format(task=obs.task, step=step, history="\n".join(lines) or "(none)",
                           observation=obs.text, memory=obs.memory or "(none)",
                           actions=obs.actions_text or ", ".join(obs.admissible_actions))


def format_response(thought: str, action: str, tag: str = "think") -> str:
    return f"<{tag}>{thought}</{tag}><action>{action}</action>"


def reasoning_tag(response: str) -> str | None:
    """The first reasoning tag (think or an RLVMR meta tag) opened and closed before the
    response's `<action>`, or None."""
    lower = response.lower()
    action = lower.find("<action>")
    end = action if action >= 0 else len(lower)
    found = None
    for tag in REASONING_TAGS:
        opened = lower.find(f"<{tag}>", 0, end)
        if opened >= 0 and lower.find(f"</{tag}>", opened + len(tag) + 2, end) >= 0:
            if found is None or opened < found[0]:
                found = (opened, tag)
    return found and found[1]


def parse_action(response: str, require_think: bool = True) -> str | None:
    """The action of a response, or None when it holds no parseable action: the text of the first
    closed `<action>` tag (the innermost opening before it, so nested tags give the clean action).

    Linear time in the response length (plain `find`, no backtracking regex), so hostile or
    runaway generations cost nothing.
    """
    lower = response.lower()
    first = lower.find("<action>")
    if first < 0:
        return None
    end = lower.find("</action>", first + 8)
    if end < 0:
        return None
    start = lower.rfind("<action>", first, end)
    if require_think and reasoning_tag(response) is None:
        return None
    action = " ".join(lower[start + 8:end].split())
    return action or None


PROMPT_FILE = "agentrl_prompt.json"
"""Beside a trained model's weights: the prompt settings it was trained with."""


def save_prompt(prompt: BaseModel, model_dir: str | Path) -> None:
    """Record the recipe's `prompt` section beside a trained model."""
    write_atomic(Path(model_dir) / PROMPT_FILE, json.dumps(prompt.model_dump(mode="json"), indent=2))


def prompt_differences(prompt: BaseModel, model_dir: str | Path) -> list[str]:
    """The prompt settings in which `prompt` differs from those `model_dir` was trained with
    (none when the folder does not say)."""
    path = Path(model_dir) / PROMPT_FILE
    if not path.is_file():
        return []
    trained = json.loads(path.read_text())
    return [key for key, value in prompt.model_dump(mode="json").items() if key in trained and trained[key] != value]
