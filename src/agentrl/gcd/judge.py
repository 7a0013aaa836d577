"""Judge prompts, verdict parsing, and the external LLM judge (OpenAI-compatible endpoint).

The judge sees the context the actor saw plus the action it took, reasons inside <think>, and
answers `<verdict>good</verdict>` or `<verdict>bad</verdict>`.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import time
import urllib.request
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

from agentrl.prompting import ChatTurns, encode_prompt
from agentrl.rollout.types import StepSample

JUDGE_INSTRUCTION = ("Was this action good or bad for the task? Think briefly inside <think> </think>, "
                     "then answer <verdict>good</verdict> or <verdict>bad</verdict>.")
_VERDICT = re.compile(r"<verdict>\s*(good|bad)\s*</verdict>", re.IGNORECASE)


def judge_question(step: StepSample) -> str:
    """What the judge is asked of a step after its context: the action taken and the instruction."""
    action = step.action if step.action is not None else f"(no valid action; the reply was: {step.response!r})"
    return f"The agent's action: {action}\n{JUDGE_INSTRUCTION}"


def judge_prompt(step: StepSample) -> str:
    return f"{step.prompt}\n{judge_question(step)}"


def judge_messages(steps: list[StepSample], full_history: bool = False) -> list[dict]:
    """The chat an external judge is sent about the last of `steps` (an episode's steps up to the
    judged one): its prompt text with the question; with `prompt.full_history`, the episode's
    conversation up to the step's reply (the replies as decoded) and the question as the next turn."""
    if not full_history:
        return [{"role": "user", "content": judge_prompt(steps[-1])}]
    turns = [m for s in steps
             for m in ({"role": "user", "content": s.prompt}, {"role": "assistant", "content": s.response})]
    return turns + [{"role": "user", "content": judge_question(steps[-1])}]


def judge_ids(tokenizer, step: StepSample, turns: ChatTurns | None = None) -> list[int]:
    """The token ids the actor judges a step from: the step's prompt text with the question; with
    `prompt.full_history` (`turns`), the episode's own conversation up to the step's sampled reply,
    token for token, and the question as the next user turn."""
    if turns is None:
        return encode_prompt(tokenizer, judge_prompt(step))
    return turns.next(step.prompt_ids, step.response_ids, judge_question(step))


def judgment_response(label: bool, reason: str) -> str:
    """The response a perfect judge gives (used to build judgment SFT data)."""
    word = "good" if label else "bad"
    return f"<think>{reason.capitalize()}.</think><verdict>{word}</verdict>"


def parse_verdict(text: str) -> bool | None:
    """True (good), False (bad), or None when there is no verdict tag or the tags disagree."""
    verdicts = {m.lower() for m in _VERDICT.findall(text)}
    return None if len(verdicts) != 1 else verdicts.pop() == "good"


def critique(text: str) -> str:
    """The reasoning of a judgment (the first closed <think> text), or the whole reply without its
    verdict tags. Linear time: plain `find` (a lazy regex rescans the rest of the text for every
    unclosed <think>)."""
    start = text.find("<think>")
    end = text.find("</think>", start + 7) if start >= 0 else -1
    return (text[start + 7:end] if end >= 0 else _VERDICT.sub("", text)).strip()


def vote(verdicts: list[bool | None], agree: int) -> bool | None:
    """The verdict at least `agree` of the answers give, else None (paper: 5 asks, >= 4 agree).
    Unparseable answers count as asked but agree with nothing."""
    counts = Counter(v for v in verdicts if v is not None)
    for verdict, n in counts.most_common(1):
        if n >= agree:
            return verdict
    return None


class EndpointError(RuntimeError):
    """An endpoint call that failed every attempt (network, HTTP status, or reply shape)."""


class ChatEndpoint:
    """A chat-completions endpoint: POST {base_url}/chat/completions. The API key is read from
    the environment variable named by `api_key_env` at call time and never stored or logged.

    Every failure of a call (refused or dropped connection, timeout, HTTP error status, a reply
    that is not JSON or not of the chat-completions shape) is retried `retries` times with
    exponential backoff (`backoff_s`, doubled each time); then `complete` raises EndpointError,
    which its callers count and carry on without (an unlabelled step, the previous hint)."""

    def __init__(self, base_url: str, model: str, api_key_env: str | None, timeout_s: float,
                 retries: int = 3, backoff_s: float = 0.5):
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model, self.api_key_env, self.timeout_s = model, api_key_env, timeout_s
        self.retries, self.backoff_s = retries, backoff_s

    def complete(self, prompt: str | list[dict], n: int = 1, temperature: float = 1.0,
                 max_tokens: int = 256) -> list[str]:
        """`n` answers to `prompt`: a user message's text, or the chat's messages."""
        messages = prompt if isinstance(prompt, list) else [{"role": "user", "content": prompt}]
        body = {"model": self.model, "messages": messages, "n": n,
                "temperature": temperature, "max_tokens": max_tokens}
        for attempt in range(self.retries + 1):
            try:
                return self._post(body)
            except (OSError, http.client.HTTPException, ValueError) as err:  # URLError, timeouts: OSError
                failure = f"{type(err).__name__}: {err}"
            if attempt < self.retries:
                time.sleep(self.backoff_s * 2 ** attempt)
        raise EndpointError(f"{self.url}: {failure} ({self.retries + 1} attempts)")

    def _post(self, body: dict) -> list[str]:
        headers = {"Content-Type": "application/json"}
        key = os.environ.get(self.api_key_env) if self.api_key_env else None
        if key:
            headers["Authorization"] = f"Bearer {key}"
        request = urllib.request.Request(self.url, json.dumps(body).encode(), headers, method="POST")
        with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
            reply = json.loads(response.read())
        choices = reply.get("choices") if isinstance(reply, dict) else None
        if not isinstance(choices, list) or not choices:
            raise ValueError("the reply has no 'choices' list")
        texts = []
        for choice in choices:
            message = choice.get("message") if isinstance(choice, dict) else None
            if not isinstance(message, dict):
                raise ValueError("a choice has no 'message' object")
            content = message.get("content")
            if not isinstance(content, (str, type(None))):
                raise ValueError(f"a choice's message content is {type(content).__name__}, not text")
            texts.append(content or "")
        return texts


class ExternalJudge:
    """Labels steps by asking an LLM `asks` times and keeping verdicts with >= `agree` votes."""

    def __init__(self, endpoint: ChatEndpoint, asks: int, agree: int, temperature: float,
                 max_tokens: int, concurrency: int = 8):
        self.endpoint, self.asks, self.agree = endpoint, asks, agree
        self.temperature, self.max_tokens, self.concurrency = temperature, max_tokens, concurrency
        self.errors = 0
        """Requests that failed (network, HTTP status, malformed reply); their steps stay unlabelled."""
        self.counts = dict.fromkeys(("asked", "answers", "parsed", "agreed"), 0)
        """The last `label` call's steps asked about, answers received, answers with a verdict, and
        steps whose verdicts agreed (each step that is not labelled is in one of the gaps)."""

    def _ask(self, messages: list[dict]) -> list[bool | None] | EndpointError:
        """The parsed verdicts of the answers to a step's chat (`judge_messages`), or the request's failure."""
        try:
            replies = self.endpoint.complete(messages, self.asks, self.temperature, self.max_tokens)
        except EndpointError as error:
            return error
        return [parse_verdict(r) for r in replies]

    def label(self, asks: list[list[dict]]) -> list[bool | None]:
        """A verdict (or None) for each step's chat (`judge_messages`)."""
        with ThreadPoolExecutor(self.concurrency) as executor:
            answers = list(executor.map(self._ask, asks))
        failures = [a for a in answers if isinstance(a, EndpointError)]
        if failures and self.errors == 0:
            print(f"external judge at {self.endpoint.url} failed ({failures[0]}); such steps stay unlabelled")
        self.errors += len(failures)
        answers = [None if isinstance(a, EndpointError) else a for a in answers]
        verdicts = [None if a is None else vote(a, self.agree) for a in answers]
        received = [a for a in answers if a is not None]
        self.counts = {"asked": len(asks), "answers": sum(map(len, received)),
                       "parsed": sum(v is not None for a in received for v in a),
                       "agreed": sum(v is not None for v in verdicts)}
        return verdicts
