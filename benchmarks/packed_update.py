"""Packed vs unpacked updates on a run's saved step samples, alternating after a warm-up: is the
prefix tree faster per update where the attention kernel matters (a GPU), not only on CPU?

The packed rows need a 4-D mask (each token sees its ancestors in the tree), which takes SDPA off
its flash kernel; unpacked rows are plain causal ones. For each of the run's last `--steps`
saved steps, the first mini-batch the trainer would deal (grouped by task group, the recipe's
`rl.mini_batch_size` and `rl.micro_batch_tokens`) is run through the actor's forward and backward
(`response_logprobs`, every micro-batch, the packing itself included in the time) on a
random-init model of `--shape` with the run's tokenizer. Modes:

- unpacked: one row per sample (`rl.pack_prefixes: false`);
- packed: prefix trees, SDPA with the tree mask (the default: a sample joins a row when its
  sharing pays for the row's longer attention at the model's shape, `Packing.for_model`);
- packed-no-cost: prefix trees joining every sample that shares a leading token and fits (pair
  cost 0, the rule before `Packing` weighed the attention);
- flex (CUDA only): the packed trees through FlexAttention with a block mask built from them
  (torch compiles it per shape: its first calls are slow).

Each mode runs once untimed, then the modes alternate A B C C B A for `--repeats` rounds. Per
mode: the median time, tokens processed (the samples'), computed (real tokens of the rows) and
run (padding included), the (query, key) pairs its attention computes (rows x width^2:
a masked kernel computes them all), peak memory, and how far its log-probs are from the unpacked ones. Rows are
appended to benchmarks/results/packed_update.csv.

    python benchmarks/packed_update.py runs/demo-seeds/seed0 --shape tiny                 # CPU check
    python benchmarks/packed_update.py runs/alfworld-cpu/seed0 --shape qwen2.5-1.5b --dtype bfloat16 \\
        --modes unpacked packed flex                                                      # one GPU
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
from pathlib import Path

import torch
from grpo_step import SHAPES, make_model
from packing_tokens import step_samples
from results_csv import append_rows, commit
from transformers import AutoModelForCausalLM

from agentrl.forward import response_logprobs
from agentrl.kernels import linear_logprob
from agentrl.models import load_tokenizer
from agentrl.packing import Packing, micro_batches, per_sample
from agentrl.recipe import load_config
from agentrl.trainer import mini_batch_split, shuffled

RESULTS = Path(__file__).resolve().parent / "results" / "packed_update.csv"


def flex_logprobs(model, batch):
    """`response_logprobs` of a packed batch with the tree as a FlexAttention block mask."""
    from torch.nn.attention.flex_attention import create_block_mask
    batch = batch.to(model.device)
    end = batch.subtree_end
    block = create_block_mask(lambda b, h, q, kv: (kv <= q) & (q < end[b, kv]), *end.shape[:1], None,
                              end.shape[1], end.shape[1], device=end.device)
    hidden = model.get_decoder()(input_ids=batch.input_ids, attention_mask=block,
                                 position_ids=batch.position_ids).last_hidden_state
    hidden = hidden.flatten(0, 1)[batch.predict]
    return linear_logprob(hidden, model.get_output_embeddings().weight, batch.input_ids[batch.mask])[0]


def logprobs(model, batch, mode: str) -> torch.Tensor:
    if mode != "flex":
        return response_logprobs(model, batch)[0]
    model.set_attn_implementation("flex_attention")
    try:
        return flex_logprobs(model, batch)
    finally:
        model.set_attn_implementation("sdpa")


def packing(model, mode: str) -> Packing | None:
    if mode == "unpacked":
        return None
    return Packing() if mode == "packed-no-cost" else Packing.for_model(model.config)


def update(model, samples, budget: int, pad_id: int, mode: str) -> dict:
    """One forward and backward of the mean log-prob of `samples`' trained tokens, packing included."""
    cuda = model.device.type == "cuda"
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    model.zero_grad(set_to_none=True)
    start = time.perf_counter()
    batches = micro_batches(samples, budget, pad_id, packing(model, mode))
    total = sum(b.n_tokens for b in batches)
    for batch in batches:
        (logprobs(model, batch, mode).sum() / total).backward()
    if cuda:
        torch.cuda.synchronize()
    return {"time": time.perf_counter() - start, "computed": sum(b.n_computed for b in batches),
            "run": sum(b.input_ids.numel() for b in batches),
            "pairs": sum(b.input_ids.shape[0] * b.input_ids.shape[1] ** 2 for b in batches),
            "peak_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else float("nan")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", type=Path, nargs="+", help="run folders with config.yaml, sft/model and rl/rollouts")
    parser.add_argument("--steps", type=int, default=3, help="the run's last saved steps used")
    parser.add_argument("--shape", default="tiny", choices=list(SHAPES))
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--modes", nargs="+", default=["unpacked", "packed"], choices=["unpacked", "packed", "packed-no-cost", "flex"])
    parser.add_argument("--repeats", type=int, default=2, help="rounds of A B C C B A")
    parser.add_argument("--out", default=str(RESULTS))
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if "flex" in args.modes and device != "cuda":
        raise SystemExit("flex: FlexAttention has no backward on CPU")
    # One model for every run, its vocabulary the largest of theirs.
    widest = max((run / "sft" / "model" for run in args.runs),
                 key=lambda folder: json.loads((folder / "config.json").read_text())["vocab_size"])
    with tempfile.TemporaryDirectory() as tmp:
        make_model(Path(tmp) / "model", args.shape, args.dtype, str(widest))
        model = AutoModelForCausalLM.from_pretrained(Path(tmp) / "model", dtype=getattr(torch, args.dtype),
                                                     attn_implementation="sdpa").to(device).train()
    for run in args.runs:
        rows = measure(model, run, args.steps, args.modes, args.repeats)
        for row in rows:
            row.update(shape=args.shape, dtype=args.dtype, torch=torch.__version__, commit=commit(),
                       device=torch.cuda.get_device_name() if device == "cuda" else "cpu")
            print(row, flush=True)
        append_rows(args.out, rows)


def measure(model, run: Path, steps: int, modes: list[str], repeats: int) -> list[dict]:
    """One row per mode for `run`'s last `steps` saved steps (module docstring)."""
    config = load_config(run / "config.yaml")
    tokenizer = load_tokenizer(str(run / "sft" / "model"))
    paths = sorted((run / "rl" / "rollouts").glob("step_*.jsonl.gz"))[-steps:]
    mini_batches = []
    for path in paths:  # the first mini-batch the trainer deals of each step, grouped by task group
        samples, groups = step_samples(path, tokenizer)
        size = config.rl.mini_batch_size
        mini_batches.append(mini_batch_split(shuffled(samples, groups, random.Random(path.name)), size,
                                             -(-len(samples) // size), 1)[0])
    budget, pad_id = config.rl.micro_batch_tokens, tokenizer.pad_token_id

    def compute(mode):
        return [update(model, samples, budget, pad_id, mode) for samples in mini_batches]

    # Warm-up (kernels, caches, compiles) and the log-probs of each mode against the unpacked ones.
    gap = {}
    with torch.no_grad():
        for samples in mini_batches:
            ref = per_sample(samples, budget, pad_id, lambda bs: [logprobs(model, b, "unpacked") for b in bs])
            for mode in modes:
                out = per_sample(samples, budget, pad_id, lambda bs, mode=mode: [logprobs(model, b, mode) for b in bs],
                                 packing(model, mode))
                diff = max(float((a.float() - b.float()).abs().max()) for a, b in zip(out, ref))
                gap[mode] = max(gap.get(mode, 0.0), diff)
    for mode in modes:
        compute(mode)
    timed = {mode: [] for mode in modes}
    for _ in range(repeats):
        for mode in [*modes, *reversed(modes)]:
            timed[mode].append(compute(mode))
            print(run.name, mode, [round(r["time"], 3) for r in timed[mode][-1]], flush=True)
    rows = []
    for mode, rounds in timed.items():
        per_round = [sum(r["time"] for r in steps) for steps in rounds]
        first = rounds[0]
        rows.append({"mode": mode, "run": str(run), "steps": len(paths), "samples": sum(map(len, mini_batches)),
                     "processed": sum(len(s.ids) for samples in mini_batches for s in samples),
                     "computed": sum(r["computed"] for r in first), "run_tokens": sum(r["run"] for r in first),
                     "attention_pairs": sum(r["pairs"] for r in first),
                     "time_s": round(statistics.median(per_round), 3), "rounds": len(per_round),
                     "peak_gib": round(max(r["peak_gib"] for steps in rounds for r in steps), 2),
                     "max_logp_diff": f"{gap[mode]:.1e}"})
    base = next((r["time_s"] for r in rows if r["mode"] == "unpacked"), None)
    for row in rows:
        row["vs_unpacked"] = round(row["time_s"] / base, 3) if base else ""
    return rows


if __name__ == "__main__":
    main()
