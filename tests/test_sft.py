import json

import pytest

from agentrl.config import HouseholdEnvConfig, OptimConfig, PromptConfig, SFTConfig
from agentrl.data import collect_expert_data, read_chat_dataset
from agentrl.envs import make_env
from agentrl.models import load_model, load_tokenizer
from agentrl.sft import encode_conversation, train_sft
from agentrl.tracking import Tracker, read_metrics

from conftest import COMPACT


def test_expert_dataset_is_chat_jsonl(tmp_path):
    stats = collect_expert_data(make_env(HouseholdEnvConfig()), PromptConfig(), 5, tmp_path / "d.jsonl", 0)
    assert stats["successful"] == 5 and stats["examples"] >= 10
    first = json.loads((tmp_path / "d.jsonl").read_text().splitlines()[0])
    assert [m["role"] for m in first["messages"]] == ["user", "assistant"]
    assert first["messages"][1]["content"].startswith("<think>")


def test_malformed_dataset_line_is_named(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"messages": [{"role": "user", "content": "x"}]}\n{"oops": 1}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2"):
        read_chat_dataset(path)


def test_loss_mask_covers_only_the_assistant_turn(tiny_model_dir):
    tokenizer = load_tokenizer(tiny_model_dir)
    messages = [{"role": "user", "content": "Task: look."}, {"role": "assistant", "content": "<action>look</action>"}]
    sample = encode_conversation(tokenizer, messages)
    trained = [i for i, m in zip(sample.ids, sample.mask) if m]
    assert tokenizer.decode(trained) == "<action>look</action><|im_end|>"
    weighted = encode_conversation(tokenizer, messages, prompt_weight=0.5)
    assert weighted.n_targets == len(weighted.ids) - 1
    assert weighted.weight.count(1.0) == len(trained)


def test_sft_learns_the_expert_data(tiny_model_dir, tmp_path):
    env = make_env(HouseholdEnvConfig())
    prompt = PromptConfig(template=COMPACT, history_length=1)
    collect_expert_data(env, prompt, 4, tmp_path / "d.jsonl", 0)
    tracker = Tracker(tmp_path / "logs")
    config = SFTConfig(epochs=8, batch_size=8, prompt_loss_weight=0.2, optim=OptimConfig(lr=3e-3))
    train_sft(load_model(tiny_model_dir), load_tokenizer(tiny_model_dir), tmp_path / "d.jsonl", config, 0,
              tmp_path / "model", tracker)
    tracker.close()
    losses = [r["sft/loss"] for r in read_metrics(tmp_path / "logs" / "metrics.jsonl")]
    assert losses[-1] < 0.5 * losses[0]
    assert (tmp_path / "model" / "model.safetensors").exists()
    load_tokenizer(tmp_path / "model")


def test_expert_data_with_rlvmr_meta_tags(tmp_path):
    from agentrl.prompting import parse_action, reasoning_tag

    path = tmp_path / "meta.jsonl"
    collect_expert_data(make_env(HouseholdEnvConfig()), PromptConfig(expert_tags="meta"), 5, path, 0)
    answers = [m[-1]["content"] for m in read_chat_dataset(path)]
    tags = [reasoning_tag(a) for a in answers]
    assert tags[0] == "planning" and {"explore", "monitor"} <= set(tags) and "think" not in tags
    assert all(parse_action(a) for a in answers)
    for answer, tag in zip(answers, tags):  # explore only for going somewhere
        assert tag != "explore" or parse_action(answer).startswith("go to ")
