"""What SmolLM2-135M-Instruct costs on this machine, to size `recipes/alfworld-smollm2.yaml`:
SFT steps on real ALFWorld expert examples through the framework's own path (the single actor,
`sft_loss`, `micro_batches`) with full weights or LoRA, in float32 or bfloat16 parameters (bf16
steps go through fp32 master weights, as the actor does), and generation with the HF sampler
(shared-prefix decoding on and off) on the same prompts. All measured side by side in one run;
rows are appended to benchmarks/results/smollm2_sizing.csv.

    agentrl model import-smollm2 --out runs/smollm2       # once
    python benchmarks/smollm2_sizing.py runs/smollm2 runs/alfworld-smollm2/expert.jsonl

The `cpu` column is the instruction set torch uses (AVX2, AVX512): bf16 is fast only where oneDNN
has bf16 instructions (AVX-512 / AMX); on AVX2 it takes a slow fallback path.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from agentrl.actor import LoRAConfig, SingleActorConfig
from agentrl.config.sections import OptimConfig, SamplingConfig
from agentrl.data import encode_conversation, read_chat_dataset
from agentrl.models import add_lora, load_model, load_tokenizer
from agentrl.packing import micro_batches
from agentrl.registry import ACTORS
from agentrl.sampler.hf import HFSampler
from agentrl.sft import sft_loss
from results_csv import append_rows, commit

RESULTS = Path(__file__).resolve().parent / "results" / "smollm2_sizing.csv"


def train_rate(model_path: str, samples, dtype: str, lora: bool, batch: int, steps: int, pad: int) -> float:
    """Tokens per second of SFT steps (the best of `steps` after one warm-up)."""
    model = load_model(model_path, dtype)
    if lora:
        torch.manual_seed(0)
        model = add_lora(model, LoRAConfig())
    actor = ACTORS.get("single")(SingleActorConfig(), model, OptimConfig(lr=1e-5), [])
    best = float("inf")
    for i in range(steps + 1):
        chunk = samples[i * batch:(i + 1) * batch]
        total_weight = sum(sum(s.weight) for s in chunk)
        start = time.perf_counter()
        actor.optimizer_step([(micro_batches(chunk, 16384, pad), sft_loss(actor, total_weight))])
        if i:
            best = min(best, time.perf_counter() - start)
    tokens = max(sum(len(s.ids) for s in samples[i * batch:(i + 1) * batch]) for i in range(1, steps + 1))
    return tokens / best


def generate_rate(model_path: str, prompts: list[list[int]], dtype: str, share: bool, tokenizer) -> float:
    """Sampled tokens per second for one batch of prompts (temperature 1, at most 32 new tokens)."""
    sampler = HFSampler(load_model(model_path, dtype).eval(), tokenizer, share)
    params = SamplingConfig(temperature=1.0, max_new_tokens=32)
    torch.manual_seed(0)
    sampler.generate(prompts[:2], params)  # warm-up
    start = time.perf_counter()
    out = sampler.generate(prompts, params)
    return sum(len(g.token_ids) for g in out) / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("model")
    parser.add_argument("data", help="an expert chat dataset (agentrl data)")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--prompts", type=int, default=16, help="prompts of one generation batch")
    parser.add_argument("--weights", nargs="+", choices=("full", "lora"), default=["full", "lora"],
                        help="SFT with full weights, LoRA, or both")
    args = parser.parse_args()
    tokenizer = load_tokenizer(args.model)
    conversations = read_chat_dataset(args.data)
    samples = [encode_conversation(tokenizer, c, 0.1) for c in conversations[:args.batch * (args.steps + 1)]]
    prompts = [tokenizer.apply_chat_template(c[:-1], add_generation_prompt=True, tokenize=True, return_dict=True)
               ["input_ids"] for c in conversations[:args.prompts]]
    rows, threads = [], torch.get_num_threads()
    for dtype in ("float32", "bfloat16"):
        for lora in [w == "lora" for w in args.weights]:
            rate = train_rate(args.model, samples, dtype, lora, args.batch, args.steps, tokenizer.pad_token_id)
            rows.append({"what": "sft step", "dtype": dtype, "weights": "lora r16" if lora else "full",
                         "tokens_per_s": round(rate, 1)})
            print(rows[-1], flush=True)
        for share in (True, False):
            rate = generate_rate(args.model, prompts, dtype, share, tokenizer)
            rows.append({"what": "generate", "dtype": dtype, "weights": "shared prefill" if share else "generate",
                         "tokens_per_s": round(rate, 1)})
            print(rows[-1], flush=True)
    mean_len = sum(len(s.ids) for s in samples) / len(samples)
    for row in rows:
        row.update(threads=threads, cpu=torch.backends.cpu.get_cpu_capability(), batch=args.batch if row["what"] == "sft step" else args.prompts,
                   mean_example_tokens=round(mean_len), commit=commit())
    append_rows(RESULTS, rows)


if __name__ == "__main__":
    main()
