"""How many of the update's tokens prefix packing leaves to compute, on a run's saved rollouts
(rl/rollouts/step_N.jsonl.gz: the real engines' as well as the demo's), without training:

- processed: the step samples' tokens (what an unpacked update computes);
- whole prompts: each mini-batch's distinct prompts once plus every response (sharing only
  identical prompts, as Prefix Grouper does);
- packed: what `micro_batches(..., pack=Packing.for_model(...))` computes (the run's model shape) for the update's mini-batches
  (`rl.mini_batch_size`, dealt as the trainer does: shuffled, or grouped by task group with
  `rl.mini_batch_order: grouped`), and for the whole step at once (the sampler check, or an
  update with one mini-batch per step);
- distinct: the step's prompts as one prefix tree plus every response (the floor).

Gradients equal to the unpacked update's bound the sharing to one mini-batch: the weights change
between mini-batches. Rows are appended to benchmarks/results/packing_tokens.csv.

    python benchmarks/packing_tokens.py runs/alfworld-cpu/seed0 [--steps 5]
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
import sys
from pathlib import Path

from transformers import AutoConfig

from agentrl.models import load_tokenizer
from agentrl.packing import Packing, TrainSample, micro_batches
from agentrl.prompting import encode_prompt
from agentrl.recipe import load_config
from agentrl.trainer import mini_batch_split, shuffled
from results_csv import append_rows, commit

RESULTS = Path(__file__).resolve().parent / "results" / "packing_tokens.csv"


def step_samples(path: Path, tokenizer) -> tuple[list[TrainSample], list[int]]:
    """A saved step's samples and each one's task group."""
    samples, groups = [], []
    with gzip.open(path, "rt") as f:
        for line in f:
            trajectory = json.loads(line)
            for step in trajectory["steps"]:
                response = tokenizer(step["response"], add_special_tokens=False).input_ids + [tokenizer.eos_token_id]
                samples.append(TrainSample.from_turn(encode_prompt(tokenizer, step["prompt"]), response))
                groups.append(trajectory["group_id"])
    return samples, groups


def distinct(samples: list[TrainSample]) -> int:
    prompts = {tuple(s.ids[:len(s.ids) - s.n_targets]) for s in samples}
    return len({p[:i] for p in prompts for i in range(1, len(p) + 1)}) + sum(s.n_targets for s in samples)


def whole_prompts(samples: list[TrainSample]) -> int:
    prompts = {tuple(s.ids[:len(s.ids) - s.n_targets]) for s in samples}
    return sum(map(len, prompts)) + sum(s.n_targets for s in samples)


def computed(samples: list[TrainSample], budget: int, packing: Packing) -> int:
    return sum(batch.n_computed for batch in micro_batches(samples, budget, pack=packing))


def saved_run(run: Path, steps: int) -> tuple:
    """A run's config, its trained model's tokenizer and packing, and its last `steps` saved RL steps."""
    config = load_config(run / "config.yaml")
    model = str(run / "sft" / "model") if (run / "sft" / "model").is_dir() else config.model.path
    paths = sorted((run / "rl" / "rollouts").glob("step_*.jsonl.gz"))[-steps:]
    if not paths:
        raise SystemExit(f"{run}/rl/rollouts: no saved rollouts")
    return config, load_tokenizer(model), Packing.for_model(AutoConfig.from_pretrained(model)), paths


def measure(run: Path, steps: int) -> dict:
    config, tokenizer, packing, paths = saved_run(run, steps)
    totals = dict.fromkeys(("samples", "processed", "whole_prompts", "packed", "packed_grouped", "packed_step",
                            "distinct"), 0)
    size, budget = config.rl.mini_batch_size, config.rl.micro_batch_tokens
    for path in paths:
        samples, groups = step_samples(path, tokenizer)
        chunks = mini_batch_split(shuffled(samples, None, random.Random(path.name)), size, -(-len(samples) // size), 1)
        grouped = mini_batch_split(shuffled(samples, groups, random.Random(path.name)), size, -(-len(samples) // size), 1)
        totals["samples"] += len(samples)
        totals["processed"] += sum(len(s.ids) for s in samples)
        totals["whole_prompts"] += sum(whole_prompts(chunk) for chunk in chunks)
        totals["packed"] += sum(computed(chunk, budget, packing) for chunk in chunks)
        totals["packed_grouped"] += sum(computed(chunk, budget, packing) for chunk in grouped)
        totals["packed_step"] += computed(samples, budget, packing)
        totals["distinct"] += distinct(samples)
    shares = {f"{k}_share": round(v / totals["processed"], 3) for k, v in totals.items() if k not in ("samples", "processed")}
    return {"run": str(run), "env": config.env.type, "steps": len(paths), "mini_batch_size": config.rl.mini_batch_size,
            **totals, **shares, "commit": commit()}


def main(measure=measure, doc: str = __doc__, results: Path = RESULTS) -> int:
    """`measure` of each run folder given (its last --steps saved steps), printed and appended to `results`."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="run folders with rl/rollouts")
    parser.add_argument("--steps", type=int, default=5, help="the last N saved steps of each run")
    args = parser.parse_args()
    rows = [measure(run, args.steps) for run in args.runs]
    for row in rows:
        print(json.dumps(row))
    append_rows(results, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
