"""Measured peak memory and time of SFT optimiser steps against `agentrl plan`'s estimate.

A random-init Qwen2 model of the given shape, token sequences that fill the micro-batch budget,
and `--steps` optimiser steps of the SFT loss through the recipe's actor backend (the code
`agentrl sft` runs), in one process (single) or on every rank of a launch (sharded backends). The
peak is `torch.cuda.max_memory_allocated` on a GPU; on CPU the process's peak resident memory
(VmHWM) above its resident memory before the model was built. Rank 0 prints one line per rank
and appends them to benchmarks/results/memory_plan.csv.

    python benchmarks/memory_plan.py                                           # CPU, single
    torchrun --nproc_per_node 2 benchmarks/memory_plan.py --backend fsdp2      # CPU, 2 gloo ranks
    torchrun --nproc_per_node 1 benchmarks/memory_plan.py --shape qwen2.5-1.5b --backend fsdp2 \\
        --dtype bfloat16 --micro-batch-tokens 8192 --activation-checkpointing   # one GPU
"""

from __future__ import annotations

import argparse
import ctypes
import json
import sys
import tempfile
import time
from pathlib import Path

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from agentrl import distributed
from agentrl.cli import leave
from agentrl.config import Config
from agentrl.packing import TrainSample, micro_batches
from agentrl.plan import GIB, KNOWN_MODELS, phase_plan
from agentrl.registry import ACTORS
from agentrl.sft import sft_loss

SHAPES = {"small": dict(hidden_size=512, intermediate_size=1536, num_hidden_layers=6, num_attention_heads=8,
                        num_key_value_heads=2, vocab_size=32000, tie_word_embeddings=True),
          "qwen2.5-1.5b": KNOWN_MODELS["Qwen/Qwen2.5-1.5B-Instruct"],
          "qwen2.5-7b": KNOWN_MODELS["Qwen/Qwen2.5-7B-Instruct"]}


M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter


def live_peaks() -> None:
    """Make this process's peak resident memory its live tensors' peak: glibc maps every block of
    64 KiB or more on its own and unmaps it when freed (by default it keeps freed memory for reuse,
    and how much of it the peak counts varies from run to run)."""
    ctypes.CDLL("libc.so.6").mallopt(M_MMAP_THRESHOLD, 65536)


def resident_bytes(field: str) -> int:
    """VmRSS or VmHWM (peak) of this process, in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def measure(shape: str, backend: str, dtype: str, tokens: int, seq: int, steps: int, checkpointing: bool,
            intermediate: int | None = None, seed: int = 0) -> dict:
    """This rank's peak bytes, the plan's estimate for it and the seconds per step after the first."""
    cuda = torch.cuda.is_available()
    world, rank = distributed.world(), distributed.rank()
    folder = Path(tempfile.mkdtemp())
    hf_config = Qwen2Config(**{**SHAPES[shape], **({"intermediate_size": intermediate} if intermediate else {})},
                            max_position_embeddings=max(4096, seq))
    hf_config.save_pretrained(folder)  # the plan reads the shape from it
    actor_cfg = {"backend": backend, "activation_checkpointing": checkpointing}
    config = Config(model={"path": str(folder), "dtype": dtype},
                    sft={"actor": actor_cfg, "micro_batch_tokens": tokens, "optim": {"lr": 1e-5}})
    estimate = sum(phase_plan(config, "sft", world, cuda).values())

    if cuda:
        torch.cuda.reset_peak_memory_stats()
    else:
        live_peaks()
    before = resident_bytes("VmRSS")
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(hf_config).to(getattr(torch, dtype)).to(distributed.device())
    actor = ACTORS.get(backend)(config.sft.actor, model, config.sft.optim, [])
    g = torch.Generator().manual_seed(seed + rank)
    per_rank = max(1, tokens // seq)  # sequences filling one micro-batch
    samples = [TrainSample.from_turn(torch.randint(5, hf_config.vocab_size, (seq * 3 // 4,), generator=g).tolist(),
                                     torch.randint(5, hf_config.vocab_size, (seq - seq * 3 // 4,), generator=g).tolist(),
                                     weight=[1.0] * (seq - seq * 3 // 4)) for _ in range(per_rank)]
    total_weight = sum(len(s.weight) for s in samples) * world
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        actor.optimizer_step([(micro_batches(samples, tokens), sft_loss(actor, total_weight))])
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    peak = torch.cuda.max_memory_allocated() if cuda else resident_bytes("VmHWM") - before
    return {"shape": shape, "intermediate": hf_config.intermediate_size, "backend": backend, "ranks": world, "rank": rank, "dtype": dtype, "tokens": tokens,
            "checkpointing": checkpointing, "device": torch.cuda.get_device_name() if cuda else "cpu",
            "estimate_gib": estimate / GIB, "measured_gib": peak / GIB, "ratio": peak / estimate,
            "step_s": sum(times[1:]) / max(len(times) - 1, 1)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="small")
    parser.add_argument("--backend", default="single", choices=["single", "fsdp2", "zero2", "zero3"])
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--micro-batch-tokens", type=int, default=2048)
    parser.add_argument("--seq", type=int, default=512, help="tokens of one sequence")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--activation-checkpointing", action="store_true")
    parser.add_argument("--intermediate", type=int, help="the shape's MLP width instead")
    parser.add_argument("--json", help="also write this rank-0 result list as JSON here")
    args = parser.parse_args(argv)
    torch.set_num_threads(max(1, torch.get_num_threads() // max(1, int(__import__("os").environ.get(
        "LOCAL_WORLD_SIZE", "1")))))
    distributed.init_from_env()
    row = measure(args.shape, args.backend, args.dtype, args.micro_batch_tokens, args.seq, args.steps,
                  args.activation_checkpointing, args.intermediate)
    rows = distributed.gather([row])
    if distributed.is_main():
        for r in rows:
            print(json.dumps(r))
        if args.json:
            Path(args.json).write_text(json.dumps(rows, indent=2))
        else:
            sys.path.insert(0, str(Path(__file__).parent))
            from results_csv import append_rows, commit
            append_rows(Path(__file__).parent / "results" / "memory_plan.csv", [{"commit": commit(), **r} for r in rows])
    distributed.shutdown()
    return 0


if __name__ == "__main__":
    leave(main())  # a launched rank skips the interpreter's teardown of gloo's threads
