"""GRPO steps of the household environment, timed by phase, with peak memory: the GPU check of a
model shape at the papers' rollout size (16 tasks x 8 rollouts).

A random-init Qwen2 model of the given shape (the vocabulary of the real model, the tokenizer a
small one trained on household text: its ids are a prefix of the vocabulary), the HF sampler, the
actor backend asked for, and `--steps` training steps through `RLTrainer.train_step` (the code
`agentrl train` runs). Per step: the trainer's phase times (rollout generation and environment,
update, ...), and the peak memory (`torch.cuda.max_memory_allocated` on a GPU; on CPU the peak
resident memory). Each step's row is appended to benchmarks/results/grpo_step.csv as it ends.

With `--recipe`, the recipe's environment, prompt, sampling and RL settings are timed instead of
the household's (a real engine's recipe on a GPU: its time per step beside the CPU figures), on
the random-init `--shape` with `--tokenizer`'s tokenizer and prompt, or on `--model` as it is.

    python benchmarks/grpo_step.py --shape tiny --tasks 2 --group 2                # CPU check
    torchrun --nproc_per_node 1 benchmarks/grpo_step.py --shape qwen2.5-1.5b \\
        --dtype bfloat16 --backend fsdp2 --activation-checkpointing                   # one GPU
    python benchmarks/grpo_step.py --recipe recipes/alfworld-cpu.yaml --shape qwen2.5-1.5b \\
        --dtype bfloat16 --tokenizer runs/alfworld-cpu/seed0/sft/model --steps 3      # ALFWorld, 1.5B
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from pathlib import Path

import torch
import yaml
from memory_plan import resident_bytes
from results_csv import append_rows, commit
from transformers import Qwen2Config, Qwen2ForCausalLM

from agentrl import distributed
from agentrl.config import PromptConfig, TinyModelConfig
from agentrl.envs import make_env
from agentrl.envs.household.env import HouseholdEnvConfig
from agentrl.models import init_tiny_model
from agentrl.plan import KNOWN_MODELS
from agentrl.recipe import load_config
from agentrl.trainer import RLTrainer

SHAPES = {"tiny": dict(hidden_size=128, intermediate_size=512, num_hidden_layers=4, num_attention_heads=2,
                       num_key_value_heads=1, vocab_size=1024, tie_word_embeddings=True),
          "qwen2.5-0.5b": KNOWN_MODELS["Qwen/Qwen2.5-0.5B-Instruct"],
          "qwen2.5-1.5b": KNOWN_MODELS["Qwen/Qwen2.5-1.5B-Instruct"]}


def make_model(folder: Path, shape: str, dtype: str, tokenizer: str | None) -> None:
    """The shape's random-init model beside `tokenizer`'s tokenizer and prompt files (a model
    folder), or a small household tokenizer; its ids are below the shape's vocabulary."""
    if tokenizer:
        shutil.copytree(tokenizer, folder, ignore=shutil.ignore_patterns("model.safetensors", "generation_config.json"))
    else:
        init_tiny_model(folder, TinyModelConfig(vocab_size=1024), make_env(HouseholdEnvConfig()), PromptConfig())
    tiny = json.loads((folder / "config.json").read_text())
    config = Qwen2Config(**{**SHAPES[shape], "vocab_size": max(SHAPES[shape]["vocab_size"], tiny["vocab_size"])},
                         bos_token_id=tiny["bos_token_id"], eos_token_id=tiny["eos_token_id"],
                         pad_token_id=tiny.get("pad_token_id"), max_position_embeddings=4096)
    torch.manual_seed(0)
    Qwen2ForCausalLM(config).to(getattr(torch, dtype)).save_pretrained(folder)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--recipe", help="time this recipe's environment and RL settings (default: household, 16 x 8)")
    parser.add_argument("--model", help="train this model folder as it is (default: a random-init --shape)")
    parser.add_argument("--tokenizer", help="the random-init model's tokenizer: this model folder's")
    parser.add_argument("--set", action="append", default=[], help="override key.sub=value (repeatable)")
    parser.add_argument("--shape", default="tiny", choices=list(SHAPES))
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--backend", default="single", choices=["single", "fsdp2"])
    parser.add_argument("--activation-checkpointing", action="store_true")
    parser.add_argument("--tasks", type=int, default=16, help="household tasks per step")
    parser.add_argument("--group", type=int, default=8, help="household rollouts per task")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=64, help="household response tokens")
    parser.add_argument("--workers", type=int, default=0, help="household environment worker processes")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "grpo_step.csv"))
    args = parser.parse_args()
    distributed.init_from_env()  # one rank (fsdp2 needs a process group)
    cuda = torch.cuda.is_available()
    if args.model:
        folder = Path(args.model)
    else:
        folder = Path(tempfile.mkdtemp()) / "model"
        make_model(folder, args.shape, args.dtype, args.tokenizer)
    run_dir = Path(tempfile.mkdtemp()) / "run"
    actor = {"backend": args.backend, "activation_checkpointing": args.activation_checkpointing}
    recipe = Path(args.recipe) if args.recipe else run_dir.parent / "household.yaml"
    if not args.recipe:
        recipe.write_text(yaml.safe_dump({
            "seed": 0, "env": {"type": "household"}, "sampling": {"max_new_tokens": args.max_new_tokens},
            "rl": {"tasks_per_step": args.tasks, "group_size": args.group, "mini_batch_size": args.tasks * args.group * 4,
                   "micro_batch_tokens": 16384, "env_pool": {"workers": args.workers}},
            "eval": {"splits": ["l0"]}}))
    config = load_config(recipe, [
        f"run_dir={run_dir}", f"model.path={folder}", f"model.dtype={args.dtype}", f"rl.steps={args.steps}",
        f"rl.actor={json.dumps(actor)}", "rl.check_logprobs_every=0", "rl.save_rollouts=0", "eval.episodes=1",
        *args.set])
    with RLTrainer(config, str(folder), Path(config.run_dir)) as trainer:
        for step in range(1, args.steps + 1):
            if cuda:
                torch.cuda.reset_peak_memory_stats()
            metrics = trainer.train_step()
            peak = torch.cuda.max_memory_allocated() if cuda else resident_bytes("VmHWM")
            row = {"recipe": recipe.stem, "shape": "trained" if args.model else args.shape,
                   "dtype": args.dtype, "backend": args.backend, "checkpointing": args.activation_checkpointing,
                   "packed": config.rl.pack_prefixes, "workers": config.rl.env_pool.workers,
                   "tasks": config.rl.tasks_per_step, "group": config.rl.group_size,
                   "device": torch.cuda.get_device_name() if cuda else "cpu", "commit": commit(), "rl_step": step,
                   "peak_gib": round(peak / 2**30, 2),
                   **{k.removeprefix("timing_s/") + "_s": round(v, 2) for k, v in metrics.items()
                      if k.startswith("timing_s/")},
                   "gen_tokens_per_s": round(metrics["throughput/gen_tokens_per_s"], 1),
                   "tokens_processed": metrics.get("tokens/processed"), "tokens_computed": metrics.get("tokens/computed")}
            append_rows(args.out, [row])
            print(row, flush=True)


if __name__ == "__main__":
    main()
