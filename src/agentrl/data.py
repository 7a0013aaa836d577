"""Expert trajectories as a JSONL chat dataset (one line per environment step)."""

from __future__ import annotations

import json
import multiprocessing as mp
import random
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

from agentrl.config import ConfigError
from agentrl.envs.base import NoExpertMove, sample_tasks
from agentrl.envs.pool import MAIN_GUARD_HINT, ctrl_c_held, ignore_ctrl_c
from agentrl.errors import RunError
from agentrl.packing import TrainSample
from agentrl.progress import task
from agentrl.prompting import ChatTurns, HistoryEntry, format_response, render_prompt
from agentrl.rollout.types import StepSample, Trajectory


def expert_episode(env, task_id: str, prompt, detours: float = 0.0, rng: random.Random | None = None,
                   keep_failed: bool = False) -> list[dict]:
    """The chat examples of one expert episode (`scored_expert_episode`'s first half)."""
    return scored_expert_episode(env, task_id, prompt, detours, rng, keep_failed)[0]


def scored_expert_episode(env, task_id: str, prompt, detours: float = 0.0, rng: random.Random | None = None,
                          keep_failed: bool = False) -> tuple[list[dict], bool]:
    """The chat examples of one expert episode, or [] if the expert failed it (or, like ALFWorld's
    hand-coded agent, found no move) unless `keep_failed`; and whether the episode succeeded.

    With `detours` > 0 (noise injection, as in DART, Laskey et al. 2017) each step executes a
    random admissible action instead of the expert's with that probability; the example still
    teaches the expert's action, so the data shows how to recover from states an error leads to.
    Such an episode keeps its examples up to the point where the expert can no longer win it."""
    obs = env.reset(task_id)
    history: list[HistoryEntry] = []
    examples, earlier = [], []  # earlier: the turns before this step's, with prompt.full_history
    visited: set[str] = set()
    detoured = False
    for step in range(env.max_steps):
        if prompt.full_history and step:
            user = render_prompt(prompt.turn_template, obs, [], step, 0)
        else:
            user = render_prompt(prompt.template, obs, history, step, prompt.history_length)
        try:
            thought, action = env.expert_action()
        except NoExpertMove:
            return (examples if detoured or keep_failed else []), False
        tag = "think"
        if prompt.expert_tags == "meta":
            tag = "planning" if step == 0 else "explore" if _goes_somewhere_new(action, visited) else "monitor"
        asked = {"role": "user", "content": user}
        examples.append({"task_id": task_id, "messages": [
            *earlier, asked, {"role": "assistant", "content": format_response(thought, action, tag)}]})
        if detours and rng.random() < detours:
            action = rng.choice(obs.admissible_actions)
            detoured = True
        if prompt.full_history:  # the history shows the move played
            earlier = [*earlier, asked, {"role": "assistant", "content": format_response(thought, action, tag)}]
        result = env.step(action)
        history.append(HistoryEntry(obs.text, action))
        obs = result.observation
        if result.done:
            return (examples if result.success or detoured or keep_failed else []), result.success
    return (examples if detoured or keep_failed else []), False


def _goes_somewhere_new(action: str, visited: set[str]) -> bool:
    if not action.startswith("go to "):
        return False
    new = action not in visited
    visited.add(action)
    return new


def expert_episodes(env, tasks: list[str], prompt, detours: float = 0.0, rng: random.Random | None = None,
                    keep_failed: bool = False, workers: int = 0, env_config=None) -> Iterator[list[dict]]:
    """`scored_expert_episode` of each task, in task order. With `workers` > 1 the episodes are played in
    that many processes, each with its own environment made from `env_config`: the same examples,
    sooner (an ALFWorld planner episode is seconds of CPU). Episodes with detours share one random
    stream, so they are always played in order here."""
    if workers <= 1 or detours:
        for task_id in tasks:
            yield scored_expert_episode(env, task_id, prompt, detours, rng, keep_failed)
        return
    pool = ProcessPoolExecutor(workers, mp.get_context("spawn"), _start_worker, (env_config, prompt, keep_failed))
    try:
        with ctrl_c_held():  # the workers start on the submits, all made here
            episodes = pool.map(_worker_episode, tasks)
        yield from episodes
    except BrokenProcessPool:
        raise RunError(f"an expert-data worker process died; {MAIN_GUARD_HINT}") from None
    finally:
        pool.shutdown(cancel_futures=True)


_worker: dict = {}


def _start_worker(env_config, prompt, keep_failed: bool) -> None:
    import atexit

    from agentrl.envs import make_env

    ignore_ctrl_c()  # the parent stops the pool
    env = make_env(env_config)
    atexit.register(env.close)
    _worker.update(env=env, prompt=prompt, keep_failed=keep_failed)


def _worker_episode(task_id: str) -> tuple[list[dict], bool]:
    return scored_expert_episode(_worker["env"], task_id, _worker["prompt"], keep_failed=_worker["keep_failed"])


def collect_expert_data(env, prompt, episodes: int, path: str | Path, seed: int,
                        split: str = "train", detours: float = 0.0, keep_failed: bool = False,
                        workers: int = 0, env_config=None) -> dict:
    """Write the successful expert episodes of `episodes` sampled tasks to `path` (with `detours`
    or `keep_failed`, see `expert_episode`, every episode's examples; `workers`: see
    `expert_episodes`). Counts: the episodes played, those the expert won, those whose examples
    were kept, and the examples."""
    rng = random.Random(seed)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    won = kept = steps = 0
    tasks = sample_tasks(env, split, episodes, rng)
    with path.open("w") as f, task("expert data", episodes) as advance:
        for examples, success in expert_episodes(env, tasks, prompt, detours, rng, keep_failed, workers, env_config):
            advance()
            won += success
            kept += bool(examples)
            steps += len(examples)
            for example in examples:
                f.write(json.dumps(example) + "\n")
    return {"episodes": episodes, "successful": won, "kept": kept, "examples": steps}


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


def play(env, task_id: str, prompt, policy) -> Trajectory:
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


def encode_conversation(tokenizer, messages: list[dict], prompt_weight: float = 0.0) -> TrainSample:
    """Context through the chat template, then the final assistant turn + end-of-turn token.

    The two parts are tokenised separately, exactly as at sampling time (prompt encoded, response
    generated), so SFT trains the token sequences the sampler produces. A conversation of user and
    assistant turns in alternation (a `prompt.full_history` episode) is built turn by turn as the
    rollout builds it (`ChatTurns`), each earlier reply tokenised on its own. Every trained token
    carries a loss weight: 1 on the response, `prompt_weight` on the context (trained only when
    > 0).
    """
    if messages[-1]["role"] != "assistant":
        raise ValueError(f"the last message must be the assistant's, got {messages[-1]['role']!r}")
    def reply(text: str) -> list[int]:
        return tokenizer(text, add_special_tokens=False).input_ids + [tokenizer.eos_token_id]

    roles = [m["role"] for m in messages]
    if len(messages) > 2 and roles == ["user", "assistant"] * (len(messages) // 2):  # a full-history episode
        turns = ChatTurns(tokenizer)
        prompt_ids = turns.first(messages[0]["content"])
        for answer, user in zip(messages[1:-1:2], messages[2:-1:2]):
            prompt_ids = turns.next(prompt_ids, reply(answer["content"]), user["content"])
    else:
        context = tokenizer.apply_chat_template(messages[:-1], tokenize=False, add_generation_prompt=True)
        prompt_ids = tokenizer(context, add_special_tokens=False).input_ids
    response_ids = reply(messages[-1]["content"])
    if prompt_weight <= 0:
        return TrainSample.from_turn(prompt_ids, response_ids, weight=[1.0] * len(response_ids))
    return TrainSample(prompt_ids + response_ids, [False] + [True] * (len(prompt_ids) + len(response_ids) - 1),
                       weight=[prompt_weight] * (len(prompt_ids) - 1) + [1.0] * len(response_ids))
