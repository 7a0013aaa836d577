"""Measured peak memory of the shared decoder's prefill against `agentrl plan`'s estimate.

A random-init Qwen2 of the given shape prefills `--prompts` distinct random prompts of
`--length` tokens through `shared_decode.tree_prefill` (the forwards of at most
`PREFILL_TOKENS` padded tokens the HF sampler runs), in a process of its own. The peak is
`torch.cuda.max_memory_allocated` above the weights on a GPU; on CPU the process's peak resident
memory (VmHWM, restarted) above its resident memory once the model is built, with every tensor of
64 KiB or more mapped on its own (glibc's `mallopt`), so that freed memory is returned at once and
the peak is the live tensors' (the same run measures the same bytes). Appends a row to
benchmarks/results/prefill_memory.csv.

    python benchmarks/prefill_memory.py --prompts 16 --length 512
    python benchmarks/prefill_memory.py --prompts 2 --length 4096
"""

from __future__ import annotations

import argparse
import ctypes
import json
import sys
from pathlib import Path

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

sys.path.insert(0, str(Path(__file__).parent))
from memory_plan import SHAPES, live_peaks, resident_bytes  # noqa: E402

from agentrl.packing import Packing  # noqa: E402
from agentrl.plan import DTYPE_BYTES, GIB, Architecture, episode_bytes, prefill_bytes  # noqa: E402
from agentrl.sampler.shared_decode import PREFILL_TOKENS, tree_prefill  # noqa: E402


def measure(shape: str, dtype: str, prompts: int, length: int, intermediate: int | None = None, seed: int = 0) -> dict:
    cuda = torch.cuda.is_available()
    if not cuda:
        live_peaks()
    config = Qwen2Config(**{**SHAPES[shape], **({"intermediate_size": intermediate} if intermediate else {})},
                         max_position_embeddings=max(4096, 2 * length))
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config).to(getattr(torch, dtype)).to("cuda" if cuda else "cpu").eval()
    g = torch.Generator().manual_seed(seed)
    batch = [torch.randint(5, config.vocab_size, (length,), generator=g).tolist() for _ in range(prompts)]
    arch, b = Architecture.from_config(config.to_dict()), DTYPE_BYTES[dtype]
    # what the sampler's plan holds: the prefill's working memory, and the prompts' keys and values it returns
    estimate = prefill_bytes(arch, prompts, length, b, PREFILL_TOKENS) + prompts * episode_bytes(arch, length, b)
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
    else:  # memory freed while the model was built goes back to the system, and the peak restarts
        ctypes.CDLL("libc.so.6").malloc_trim(0)
        Path("/proc/self/clear_refs").write_text("5")
        before = resident_bytes("VmRSS")
    with torch.no_grad():
        states = tree_prefill(model, batch, Packing.for_model(config), pad_id=0)
    peak = (torch.cuda.max_memory_allocated() if cuda else resident_bytes("VmHWM")) - before
    assert len(states) == prompts
    return {"shape": shape, "intermediate": config.intermediate_size, "dtype": dtype, "prompts": prompts, "length": length,
            "device": torch.cuda.get_device_name() if cuda else "cpu", "estimate_gib": estimate / GIB,
            "measured_gib": peak / GIB, "ratio": peak / estimate}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="small")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--length", type=int, default=512, help="tokens of each prompt")
    parser.add_argument("--intermediate", type=int, help="the shape's MLP width instead")
    parser.add_argument("--json", help="write the result here instead of the CSV")
    args = parser.parse_args(argv)
    row = measure(args.shape, args.dtype, args.prompts, args.length, args.intermediate)
    print(json.dumps(row))
    if args.json:
        Path(args.json).write_text(json.dumps(row))
    else:
        from results_csv import append_rows, commit
        append_rows(Path(__file__).parent / "results" / "prefill_memory.csv", [{"commit": commit(), **row}])
    return 0


if __name__ == "__main__":
    sys.exit(main())
