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

from agentrl.errors import ConfigError
from agentrl.files import write_atomic

if TYPE_CHECKING:
    from agentrl.envs.base import Observation

DEFAULT_TEMPLATE = (
    "You are an agent in a household. Your task is to: {task}\n"
    "You have taken {step} step(s). Recent history:\n{history}\n"
    "Current observation: {observation}\n"
    "Admissible actions: {actions}\n"
    "Think briefly inside <think> </think>, then give one admissible action inside "
    "<action> </action>."
)
DEFAULT_TURN_TEMPLATE = "Observation: {observation}\nAdmissible actions: {actions}"
TEMPLATE_FIELDS = ("task", "step", "history", "observation", "actions", "memory")
META_TAGS = ("planning", "explore", "reflection", "monitor")
REASONING_TAGS = ("think", *META_TAGS)


def encode_prompt(tokenizer, text: str) -> list[int]:
    """The token ids of `text` as one user turn in the tokenizer's chat template, the assistant's
    turn opened (what the sampler is given)."""
    chat = tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                         add_generation_prompt=True)
    return tokenizer(chat, add_special_tokens=False).input_ids


class ChatTurns:
    """A conversation's token ids built by appending turns, token in, token out (`prompt.full_history`):
    a prompt is the previous prompt, the tokens sampled for its response (never re-tokenized), the
    rest of the chat template's end of an assistant turn, then the next user turn with the
    assistant's turn opened. Both pieces are the text the template puts there, found once by
    rendering a probe conversation. A template that renders a reply otherwise once a turn follows it
    (Qwen3's and DeepSeek-R1's drop its reasoning) is refused: the appended turns would not be what
    it renders, and a model trained on them would meet other prompts when served through it."""

    PROBE = "\x00probe\x00"
    REPLY = f"<think>{PROBE}</think>{PROBE}"
    """The probe reply: a reasoning block, then the rest, as the agent's replies are."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.special = set(tokenizer.all_special_ids)
        self.head = tokenizer.apply_chat_template(self._probe(), tokenize=False)
        if self.REPLY not in self.head:
            raise self._refused(tokenizer)
        self.closing = self.head[self.head.rindex(self.REPLY) + len(self.REPLY):]
        """The template's text after an assistant message (e.g. "<|im_end|>\n")."""
        self.user("u")  # refused here, before any episode is played, if a next turn rewrites the reply

    def _probe(self, *then: str) -> list[dict]:
        return [{"role": "user", "content": "u"}, {"role": "assistant", "content": self.REPLY},
                *({"role": "user", "content": text} for text in then)]

    @staticmethod
    def _refused(tokenizer):
        return ConfigError(f"{tokenizer.name_or_path}: prompt.full_history: its chat template renders an "
                           "earlier reply otherwise once a turn follows it (Qwen3's and DeepSeek-R1's drop its "
                           "reasoning), so appended turns would not be what it renders; give the model a template "
                           "that keeps replies as given, or set prompt.full_history=false")

    def first(self, text: str) -> list[int]:
        return encode_prompt(self.tokenizer, text)

    def close(self, response_ids: list[int]) -> list[int]:
        """The tokens that end an assistant turn after `response_ids`: the template's closing text,
        less the stop token the response already ends with."""
        closing = self.closing
        if response_ids and response_ids[-1] in self.special:
            stop = self.tokenizer.decode(response_ids[-1:])
            closing = closing.removeprefix(stop)
        return self.tokenizer(closing, add_special_tokens=False).input_ids if closing else []

    def user(self, text: str) -> list[int]:
        """A user turn after an assistant turn, the assistant's next turn opened."""
        full = self.tokenizer.apply_chat_template(self._probe(text), tokenize=False, add_generation_prompt=True)
        if not full.startswith(self.head):
            raise self._refused(self.tokenizer)
        return self.tokenizer(full[len(self.head):], add_special_tokens=False).input_ids

    def next(self, prompt_ids: list[int], response_ids: list[int], text: str) -> list[int]:
        """The prompt after `prompt_ids` was answered with `response_ids` and the user said `text`."""
        return prompt_ids + response_ids + self.close(response_ids) + self.user(text)


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
