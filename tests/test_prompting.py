import json
import random
import re
import string
import time

import pytest

from agentrl.envs.household import HouseholdEnv
from agentrl.prompting import format_response, parse_action, render_prompt, HistoryEntry
from agentrl.config import PromptConfig


def test_parses_first_action_lowercased_and_folded():
    text = "<think>hmm</think><action>  Go  To\nCabinet 1 </action><action>look</action>"
    assert parse_action(text) == "go to cabinet 1"


def test_invalid_forms():
    assert parse_action("<think>x</think>go to desk 1") is None
    assert parse_action("<think>x</think><action>go to desk 1") is None
    assert parse_action("<think>x</think><action>   </action>") is None
    assert parse_action("<action>look</action>") is None  # no think block
    assert parse_action("<action>look</action>", require_think=False) == "look"
    assert parse_action("<action>look</action><think>late</think>") is None


def test_parser_survives_random_and_hostile_strings():
    rng = random.Random(0)
    pieces = ["<action>", "</action>", "<think>", "</think>", "<ACTION>", "</Action>", "<", ">", "/",
              "go to desk 1", "\x00", "\n", "é", "🙂", "<action><action>", "</think></think>"]
    alphabet = string.printable + "αβ漢字\u200b"
    for i in range(5000):
        parts = [rng.choice(pieces) if rng.random() < 0.6 else
                 "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 12))) for _ in range(rng.randint(0, 12))]
        text = "".join(parts)
        action = parse_action(text)
        # Oracle: the same rule written with regular expressions.
        lower = text.lower()
        match = re.search(r"<action>((?:(?!<action>).)*?)</action>", lower, re.S)  # the innermost opening
        expected = None
        if match and re.search(r"<think>.*?</think>", lower[:lower.find("<action>")], re.S):
            expected = " ".join(match.group(1).split()) or None
        assert action == expected, text
    # A huge runaway generation is parsed in linear time.
    assert parse_action("<think>" + "<action>" * 200_000) is None


def test_nested_or_repeated_action_tags_give_a_clean_action():
    assert parse_action("<think>x</think><action><action>go to desk 1</action></action>") == "go to desk 1"
    assert parse_action("<think>x</think><action>look<action>Go to desk 1</action>") == "go to desk 1"
    assert parse_action("<think>x</think><action>look</action><action>inventory</action>") == "look"
    assert parse_action("<think>x</think><action><action></action>") is None


def test_every_model_output_parser_is_linear_on_megabyte_inputs():
    """Hostile megabyte replies (unclosed tags repeated, runaway white space): a quadratic parser
    takes minutes on these (the old critique regex: 80k characters in 9 s)."""
    from agentrl.gcd.judge import critique, parse_verdict
    from agentrl.prompting import reasoning_tag

    n = 1_000_000
    hostile = ["<think>" * (n // 7), "<action>" * (n // 8), "<think>x</think>" + "<action>" * (n // 8),
               "<verdict>" + " " * n, "<verdict> " * (n // 10), "<planning>" * (n // 10) + "<action>a</action>",
               "</think>" * (n // 8) + "<think>", "<explore>" * (n // 9) + "</explore>" * (n // 10)]
    for text in hostile:
        start = time.perf_counter()
        parse_action(text), reasoning_tag(text), parse_verdict(text), critique(text)
        assert time.perf_counter() - start < 2.0, text[:40]
    assert critique("<think>" * 1000 + "why</think><verdict>bad</verdict>") == "<think>" * 999 + "why"


def test_expert_responses_round_trip():
    env = HouseholdEnv()
    obs = env.reset("train-0")
    thought, action = env.expert_action()
    assert parse_action(format_response(thought, action)) == action
    text = render_prompt(PromptConfig().template, obs, [HistoryEntry("a", "b")], 1, 2)
    assert obs.task in text and "go to" in text and "Observation: a" in text


def test_the_history_window_shows_the_latest_moves_in_order():
    obs = HouseholdEnv().reset("train-0")
    history = [HistoryEntry(f"seen {i}", f"did {i}") for i in range(4)]
    window = "Observation: seen 2\nAction: did 2\nObservation: seen 3\nAction: did 3"
    assert render_prompt("{history}", obs, history, 4, 2) == window
    assert render_prompt("{history}", obs, history, 4, 0) == "(none)"
    assert render_prompt("{history}", obs, history[:1], 1, 2) == "Observation: seen 0\nAction: did 0"


def test_meta_reasoning_tags_count_as_the_reasoning_block():
    from agentrl.prompting import reasoning_tag
    assert parse_action("<planning>first x</planning><action>Go to X</action>") == "go to x"
    assert reasoning_tag("<reflection>a</reflection><think>b</think><action>c</action>") == "reflection"
    assert reasoning_tag("<think>b</think><explore>a</explore><action>c</action>") == "think"
    assert reasoning_tag("<action>c</action><explore>late</explore>") is None
    assert reasoning_tag("<explore>never closed<action>c</action></explore>") is None
    assert format_response("t", "look", "monitor") == "<monitor>t</monitor><action>look</action>"


def test_the_environments_memory_fills_its_placeholder():
    from agentrl.envs.base import Observation

    template = "Task: {task}\nNotes: {memory}\nNow: {observation}\nActions: {actions}"
    obs = Observation("You arrive at desk 1.", "find a pen", ["look"], anchor="x",
                      memory="Not visited: bed 1. Holding: nothing.", actions_text="look; go to: bed 1")
    text = render_prompt(template, obs, [], 3, 0)
    assert "Notes: Not visited: bed 1. Holding: nothing.\n" in text and text.endswith("Actions: look; go to: bed 1")
    obs.memory = None
    assert "Notes: (none)\n" in render_prompt(template, obs, [], 3, 0)
    PromptConfig(template=template, history_length=0)  # a known placeholder


@pytest.mark.parametrize("full_history", [False, True], ids=["window", "full_history"])
def test_the_rollout_asks_in_each_state_what_the_expert_data_shows(tiny_model_dir, full_history):
    """Played along the expert's moves, every prompt the rollout builds (the history window of
    earlier observations and the moves made from them, or the whole conversation) is the one the
    SFT data shows in that state: what the cold start learns is what RL asks."""
    from conftest import COMPACT

    from agentrl.data import expert_episode
    from agentrl.models import load_tokenizer
    from agentrl.rollout.collect import Episode, EpisodeRules
    from agentrl.rollout.types import Trajectory
    from agentrl.sampler.base import Generation

    tokenizer = load_tokenizer(tiny_model_dir)
    prompt = PromptConfig(template=COMPACT, history_length=1, full_history=full_history)
    examples = expert_episode(HouseholdEnv(), "train-3", prompt)
    env = HouseholdEnv()
    rules = EpisodeRules(tokenizer, prompt, "", env.max_steps)
    episode = Episode(0, Trajectory("train-3", 0, env.task_type("train-3")))
    rules.started(episode, env.reset("train-3"))
    for example in examples:
        rules.ask(episode)
        assert rules.conversation(episode) == example["messages"][:-1]
        reply = tokenizer(example["messages"][-1]["content"], add_special_tokens=False).input_ids
        action = rules.act(episode, Generation(reply + [tokenizer.eos_token_id], [0.0] * (len(reply) + 1)))
        if not rules.stepped(episode, env.step(action)):
            break
    assert len(episode.trajectory.steps) == len(examples) >= 3 and episode.trajectory.success


def test_a_model_trained_with_other_prompt_settings_is_said_for_every_setting(tmp_path):
    """`prompt_differences` names each prompt setting in which a recipe differs from what the model
    was trained with (every field of the section, by construction: one added later is covered)."""
    import typing

    from agentrl.prompting import prompt_differences, save_prompt

    trained = PromptConfig()
    save_prompt(trained, tmp_path)
    assert prompt_differences(trained, tmp_path) == []
    for name, field in PromptConfig.model_fields.items():
        value = getattr(trained, name)
        if isinstance(value, bool):
            other = not value
        elif isinstance(value, (int, float)):
            other = value + 1
        elif typing.get_origin(field.annotation) is typing.Literal:
            other = next(v for v in typing.get_args(field.annotation) if v != value)
        else:
            other = value + " "
        assert prompt_differences(trained.model_copy(update={name: other}), tmp_path) == [name]
    # A model folder without the record (one trained elsewhere) says nothing, and a record from
    # before a setting existed is compared on the settings it holds.
    assert prompt_differences(PromptConfig(full_history=True, history_length=0), tmp_path / "elsewhere") == []
    record = json.loads((tmp_path / "agentrl_prompt.json").read_text())
    del record["full_history"]
    (tmp_path / "agentrl_prompt.json").write_text(json.dumps(record))
    assert prompt_differences(PromptConfig(full_history=True, history_length=0), tmp_path) == ["history_length"]
