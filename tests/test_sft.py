import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import COMPACT

from agentrl.config import ConfigError, OptimConfig, PromptConfig, SFTConfig
from agentrl.data import collect_expert_data, encode_conversation, read_chat_dataset
from agentrl.envs import make_env
from agentrl.envs.household.env import HouseholdEnvConfig
from agentrl.models import load_model, load_tokenizer
from agentrl.sft import train_sft
from agentrl.tracking import Tracker, read_metrics


def test_expert_dataset_is_chat_jsonl(tmp_path):
    path = tmp_path / "data" / "d.jsonl"  # its folder made
    stats = collect_expert_data(make_env(HouseholdEnvConfig()), PromptConfig(), 5, path, 0)
    assert stats["successful"] == 5 and stats["examples"] >= 10
    first = json.loads(path.read_text().splitlines()[0])
    assert [m["role"] for m in first["messages"]] == ["user", "assistant"]
    assert first["messages"][1]["content"].startswith("<think>")


def test_expert_data_from_worker_processes_is_the_same_file(tmp_path):
    config, prompt = HouseholdEnvConfig(), PromptConfig(template=COMPACT, history_length=1)
    serial = collect_expert_data(make_env(config), prompt, 12, tmp_path / "serial.jsonl", 3)
    parallel = collect_expert_data(make_env(config), prompt, 12, tmp_path / "parallel.jsonl", 3,
                                   workers=2, env_config=config)
    assert serial == parallel and serial["examples"] > 12
    assert (tmp_path / "serial.jsonl").read_bytes() == (tmp_path / "parallel.jsonl").read_bytes()
    # keep_failed too, on episodes the expert loses (too few steps to finish)
    short = HouseholdEnvConfig(max_steps=3)
    serial = collect_expert_data(make_env(short), prompt, 6, tmp_path / "s.jsonl", 3, keep_failed=True)
    parallel = collect_expert_data(make_env(short), prompt, 6, tmp_path / "p.jsonl", 3, keep_failed=True,
                                   workers=2, env_config=short)
    assert serial == parallel and serial["examples"] > 0
    assert serial["successful"] < serial["kept"] == 6  # most lost, all kept
    assert (tmp_path / "s.jsonl").read_bytes() == (tmp_path / "p.jsonl").read_bytes()
    # Detours draw from one random stream: asked for workers, they are played here in order.
    for workers in (0, 2):
        collect_expert_data(make_env(config), prompt, 8, tmp_path / f"detours{workers}.jsonl", 3, detours=0.5,
                            workers=workers, env_config=config)
    assert (tmp_path / "detours0.jsonl").read_bytes() == (tmp_path / "detours2.jsonl").read_bytes()
    collect_expert_data(make_env(config), prompt, 8, tmp_path / "straight.jsonl", 3)
    assert (tmp_path / "detours0.jsonl").read_bytes() != (tmp_path / "straight.jsonl").read_bytes()


def test_expert_data_workers_from_a_script_without_main_guard_name_it(tmp_path):
    script = tmp_path / "collect.py"
    script.write_text(
        "from agentrl.config import PromptConfig\n"
        "from agentrl.data import collect_expert_data\n"
        "from agentrl.envs import make_env\n"
        "from agentrl.envs.household.env import HouseholdEnvConfig\n"
        "config = HouseholdEnvConfig()\n"
        f"collect_expert_data(make_env(config), PromptConfig(), 4, {str(tmp_path / 'd.jsonl')!r}, 0, workers=2,"
        " env_config=config)\n")
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0 and "RunError" in proc.stderr and "__main__" in proc.stderr


def test_detours_teach_recovery_with_the_experts_labels(tmp_path):
    """Noise injection: the data reaches states the plain expert never visits (dead ends), and
    every example still teaches the expert's move (with every room hinted: the hinted door)."""
    from agentrl.envs.testbed import TestbedConfig
    from agentrl.prompting import parse_action

    def examples(detours):
        path = tmp_path / f"d{detours}.jsonl"
        prompt = PromptConfig(template=COMPACT, history_length=0)
        stats = collect_expert_data(make_env(TestbedConfig(doors=3)), prompt, 40, path, 0, detours=detours)
        return stats, [json.loads(line)["messages"] for line in path.read_text().splitlines()]

    plain_stats, plain = examples(0.0)
    noisy_stats, noisy = examples(0.3)
    assert plain_stats["successful"] == 40 and not any("dead end" in m[0]["content"] for m in plain)
    dead_ends = [m for m in noisy if "A dead end" in m[0]["content"]]
    assert len(dead_ends) >= 5 and all(parse_action(m[1]["content"]) == "go back" for m in dead_ends)
    for user, assistant in noisy:
        action = parse_action(assistant["content"])
        if action.startswith("go through"):
            hinted = user["content"].split("A draft comes through the ")[1].split(" door")[0]
            assert action == f"go through {hinted} door"


def test_malformed_dataset_line_is_named(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"messages": [{"role": "user", "content": "x"}]}\n{"oops": 1}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2"):
        read_chat_dataset(path)
    # Blank lines, spaces and tabs only included, are skipped; the lines keep their numbers.
    line = '{"messages": [{"role": "user", "content": "x"}]}\n'
    path.write_text(line + " \t \n\n" + line + "  \n")
    assert len(read_chat_dataset(path)) == 2
    path.write_text(line + " \t \n{}\n")
    with pytest.raises(ValueError, match=r"bad.jsonl:3"):
        read_chat_dataset(path)
    # A message without its role or its content is the line's error, not a KeyError later.
    for message in ('{"role": "user"}', '{"content": "x"}'):
        path.write_text(line + f'{{"messages": [{message}]}}\n')
        with pytest.raises(ConfigError, match=r"bad.jsonl:2: expected"):
            read_chat_dataset(path)
    # Bytes that are not UTF-8: named with the file, not a decoding traceback.
    path.write_bytes(line.encode() + b'{"messages": [{"role": "user", "content": "\xff"}]}\n')
    with pytest.raises(ConfigError, match=r"bad.jsonl: not UTF-8 text \(byte \d+\)"):
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
    collect_expert_data(make_env(HouseholdEnvConfig()), PromptConfig(expert_tags="meta"), 40, path, 0)
    answers = [m[-1]["content"] for m in read_chat_dataset(path)]
    tags = [reasoning_tag(a) for a in answers]
    assert tags[0] == "planning" and {"explore", "monitor"} <= set(tags) and "think" not in tags
    assert all(parse_action(a) for a in answers)
    # Explore when going somewhere the episode has not yet been sent (its first step aside), monitor
    # otherwise: a place gone to again is monitored.
    again, visited = 0, set()
    for answer, tag in zip(answers, tags):
        action = parse_action(answer)
        if tag == "planning":
            visited = set()
            continue
        new = action.startswith("go to ") and action not in visited
        again += action.startswith("go to ") and not new
        assert tag == ("explore" if new else "monitor"), (action, tag)
        visited.add(action)
    assert again > 0


def test_a_stopped_sft_continues_only_with_the_settings_it_was_started_with(tiny_model_dir, tmp_path):
    """`agentrl sft` SIGKILLed while writing its second checkpoint: rerun with another
    sft.save_every (which changes no step) it continues from the first; killed again and rerun
    with another learning rate it starts over, and ends where a straight run with that rate ends;
    killed again and rerun in another model.dtype it starts over too."""
    import signal
    import subprocess
    import sys

    import yaml
    from safetensors.torch import load_file

    collect_expert_data(make_env(HouseholdEnvConfig()), PromptConfig(template=COMPACT, history_length=1), 3,
                        tmp_path / "d.jsonl", 0)
    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump({"prompt": {"template": COMPACT, "history_length": 1},
                                      "sft": {"epochs": 2, "batch_size": 8, "save_every": 1}}))
    killer = Path(__file__).parent / "killer.py"

    def sft(out, *overrides, kill_at=None):
        command = [*([sys.executable, str(killer), kill_at] if kill_at else [str(Path(sys.executable).parent / "agentrl")]),
                   "sft", str(recipe), "--model", str(tiny_model_dir), "--data", str(tmp_path / "d.jsonl"),
                   "--out", str(out), *[a for o in overrides for a in ("--set", o)]]
        done = subprocess.run(command, capture_output=True, text=True, timeout=600)
        assert done.returncode == (-signal.SIGKILL if kill_at else 0), done.stderr[-3000:]
        return done.stdout + done.stderr

    out = tmp_path / "model"
    sft(out, kill_at=".tmp-step_000002@1")
    assert (tmp_path / "model.tmp" / "checkpoints" / "step_000001").is_dir() and not out.exists()
    assert "sft continuing from step_000001" in sft(out, "sft.save_every=2")
    first = load_file(out / "model.safetensors")

    sft(out, kill_at=".tmp-step_000002@1")
    assert "continuing" not in sft(out, "sft.optim.lr=1e-3")
    sft(tmp_path / "straight", "sft.optim.lr=1e-3")
    changed, straight = load_file(out / "model.safetensors"), load_file(tmp_path / "straight" / "model.safetensors")
    assert all(torch.equal(changed[k], straight[k]) for k in straight)
    assert any(not torch.equal(changed[k], first[k]) for k in first)

    sft(out, "sft.optim.lr=1e-3", kill_at=".tmp-step_000002@1")
    assert "continuing" not in sft(out, "sft.optim.lr=1e-3", "model.dtype=bfloat16")


def test_sft_weighs_prompt_tokens_and_seeds_its_adapters(tiny_model_dir, tmp_path):
    """One step on all the data: prompt_loss_weight changes the update; LoRA adapters start from
    the run's seed (the same whatever the global RNG holds, others with another seed)."""
    from safetensors.torch import load_file

    collect_expert_data(make_env(HouseholdEnvConfig()), PromptConfig(template=COMPACT, history_length=1), 2,
                        tmp_path / "d.jsonl", 0)

    def trained(name, global_seed, seed=0, weight=0.0, lora=None):
        torch.manual_seed(global_seed)
        config = SFTConfig(epochs=1, batch_size=256, prompt_loss_weight=weight, optim=OptimConfig(lr=1e-2),
                           actor=None if lora is None else {"lora": lora})
        train_sft(load_model(tiny_model_dir), load_tokenizer(tiny_model_dir), tmp_path / "d.jsonl", config, seed,
                  tmp_path / name)
        return load_file(tmp_path / name / "model.safetensors")

    def same(a, b):
        return all(torch.equal(a[k], b[k]) for k in a)

    assert not same(trained("plain", 1), trained("prompt-weighted", 1, weight=0.5))
    lora = {"r": 4, "alpha": 8}
    adapted = trained("lora", 1, lora=lora)
    assert same(trained("lora-other-global", 2, lora=lora), adapted)
    assert not same(trained("lora-seed-1", 1, seed=1, lora=lora), adapted)


def test_expert_and_judgment_data_ask_with_the_prompts_the_rollout_builds(tiny_model_dir):
    """SFT's examples are asked with the prompt RL's rollout renders in the same state (the recipe's
    template and its history length), so the cold start teaches what RL asks: the expert's episode
    as the expert data gives it and as the judgment data plays it (`play`), replayed through the
    rollout, gives the same prompts, earlier steps shown."""
    from agentrl.config import EnvPoolConfig, SamplingConfig
    from agentrl.data import expert_episode, play
    from agentrl.envs.household import HouseholdEnv
    from agentrl.envs.pool import EnvPool
    from agentrl.prompting import format_response
    from agentrl.rollout.collect import collect
    from agentrl.sampler.base import Generation

    tokenizer = load_tokenizer(tiny_model_dir)
    prompt = PromptConfig(history_length=2)
    env = HouseholdEnv(max_steps=8)
    asked = [example["messages"][-2]["content"] for example in expert_episode(env, "train-3", prompt)]
    played = play(env, "train-3", prompt, lambda obs: env.expert_action()[1]).steps
    assert len(played) >= 4

    class Replay:
        def __init__(self):
            self.step = 0

        def generate(self, prompts, params):
            text = format_response("", played[self.step].action)
            self.step += 1
            return [Generation(tokenizer(text, add_special_tokens=False).input_ids + [tokenizer.eos_token_id], [0.0])]

    with EnvPool(HouseholdEnvConfig(max_steps=8), EnvPoolConfig(workers=0)) as pool:
        replayed = [s.prompt for s in collect(pool, Replay(), tokenizer, ["train-3"], 1, prompt, SamplingConfig())[0].steps]
    assert asked == [s.prompt for s in played] == replayed
    assert "Action: " in replayed[3]
