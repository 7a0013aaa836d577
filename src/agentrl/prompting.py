"""Per-step prompts and the response parser.

A step's prompt is built from the state alone: the task, the last `history_length`
(observation, action) pairs, the current observation and the admissible actions. The response
is `<think>...</think><action>...</action>`; the action is the first `<action>` tag's text,
lower-cased with white space folded.
"""

from __future__ import annotations

from dataclasses import dataclass

from agentrl.envs.base import Observation

DEFAULT_TEMPLATE = (
    "You are an agent in a household. Your task is to: {task}\n"
    "You have taken {step} step(s). Recent history:\n{history}\n"
    "Current observation: {observation}\n"
    "Admissible actions: {actions}\n"
    "Think briefly inside <think> </think>, then give one admissible action inside "
    "<action> </action>."
)
TEMPLATE_FIELDS = ("task", "step", "history", "observation", "actions")


@dataclass
class HistoryEntry:
    observation: str
    action: str


def render_prompt(template: str, obs: Observation, history: list[HistoryEntry], step: int,
                  history_length: int) -> str:
    recent = history[-history_length:] if history_length > 0 else []
    lines = [f"Observation: {h.observation}\nAction: {h.action}" for h in recent]
    return template.format(task=obs.task, step=step, history="\n".join(lines) or "(none)",
                           observation=obs.text,
                           actions=obs.actions_text or ", ".join(obs.admissible_actions))


def format_response(thought: str, action: str) -> str:
    return f"<think>{thought}</think><action>{action}</action>"


def parse_action(response: str, require_think: bool = True) -> str | None:
    """The action of a response, or None when it holds no parseable action.

    Linear time in the response length (plain `find`, no backtracking regex), so hostile or
    runaway generations cost nothing.
    """
    lower = response.lower()
    start = lower.find("<action>")
    if start < 0:
        return None
    end = lower.find("</action>", start + 8)
    if end < 0:
        return None
    if require_think:
        think = lower.find("<think>", 0, start)
        if think < 0 or lower.find("</think>", think + 7, start) < 0:
            return None
    action = " ".join(lower[start + 8:end].split())
    return action or None
