"""What a full-history prompt costs the update, in tokens, on a run's saved rollouts
(rl/rollouts/step_N.jsonl.gz), without training. Each saved episode is rebuilt three ways:

- recipe: the prompts the run used (its window or notebook; `prompt.history_length` steps);
- full history, naive: each step's prompt is the episode so far (`prompt.full_history`, its
  first prompt the saved one, each later turn the saved prompt from its observation on: the
  observation, the actions and the closing instruction), every step its own sample;
- full history, packed: the same samples as `micro_batches(..., pack=Packing.for_model(...))`
  computes them (the run's model shape, the whole step as one mini-batch): an episode's steps
  share all but their last turn.

For each: tokens processed (the samples' lengths summed) and computed (after packing); the recipe's
prompts are packed the same way. The responses are the saved texts tokenized with an end-of-turn
token. Rows are appended to benchmarks/results/full_history_tokens.csv.

    python benchmarks/full_history_tokens.py runs/alfworld-cpu/seed0 [--steps 5]
"""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

from agentrl.packing import TrainSample, micro_batches
from agentrl.prompting import ChatTurns, encode_prompt
from packing_tokens import main, saved_run
from results_csv import commit

RESULTS = Path(__file__).resolve().parent / "results" / "full_history_tokens.csv"


def episodes(path: Path) -> list[list[dict]]:
    with gzip.open(path, "rt") as f:
        return [json.loads(line)["steps"] for line in f]


def samples(steps: list[dict], tokenizer, turns: ChatTurns) -> tuple[list[TrainSample], list[TrainSample]]:
    """One episode's step samples as the recipe prompted them, and with the full history."""
    replies = [tokenizer(s["response"], add_special_tokens=False).input_ids + [tokenizer.eos_token_id] for s in steps]
    recipe = [TrainSample.from_turn(encode_prompt(tokenizer, s["prompt"]), r) for s, r in zip(steps, replies)]
    full, prompt = [], encode_prompt(tokenizer, steps[0]["prompt"])
    for t, (step, reply) in enumerate(zip(steps, replies)):
        if t:
            turn = step["prompt"][max(step["prompt"].find(step["observation"]), 0):]
            prompt = turns.next(prompt, replies[t - 1], turn)
        full.append(TrainSample.from_turn(prompt, reply))
    return recipe, full


def measure(run: Path, steps: int) -> dict:
    config, tokenizer, packing, paths = saved_run(run, steps)
    turns = ChatTurns(tokenizer)
    budget = config.rl.micro_batch_tokens
    totals = dict.fromkeys(("samples", "recipe_processed", "recipe_packed", "full_processed", "full_packed"), 0)
    longest = 0
    for path in paths:
        recipe, full = [], []
        for episode in episodes(path):
            a, b = samples(episode, tokenizer, turns)
            recipe += a
            full += b
        totals["samples"] += len(recipe)
        for name, group in (("recipe", recipe), ("full", full)):
            totals[f"{name}_processed"] += sum(len(s.ids) for s in group)
            totals[f"{name}_packed"] += sum(b.n_computed for b in micro_batches(group, budget, pack=packing))
        longest = max(longest, max(len(s.ids) for s in full))
    base = totals["recipe_packed"]
    return {"run": str(run), "env": config.env.type, "steps": len(paths), **totals,
            "full_packed_x_recipe_packed": round(totals["full_packed"] / base, 2),
            "full_naive_x_recipe_packed": round(totals["full_processed"] / base, 2),
            "longest_full_prompt": longest, "commit": commit()}


if __name__ == "__main__":
    sys.exit(main(measure, __doc__, RESULTS))
