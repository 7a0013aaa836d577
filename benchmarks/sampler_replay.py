"""HF `generate` against the HF sampler's shared-prefix decoder (`agentrl.sampler.shared_decode`)
on the generation calls of a run's saved RL step: call k samples for the k-th step of every
trajectory that got that far (the rollout loop's lock-step batches), from the run's SFT model with
the recipe's sampling settings.

Each call runs under both samplers with the same seed, in the order A B B A for `--repeats`
rounds; per call the fastest time of each. Per run: the calls, prompts, distinct prompts, the
total seconds of each sampler and their ratio, how many generations are the same token for token,
and the largest log-prob gap between them. Rows are appended to
benchmarks/results/sampler_replay.csv.

    python benchmarks/sampler_replay.py runs/demo-seeds/seed0 runs/alfworld-cpu/seed0 runs/scienceworld-cpu/seed0
"""

from __future__ import annotations

import argparse
import gzip
import json
import time
from pathlib import Path

import torch
from results_csv import append_rows, commit

from agentrl.models import load_model, load_tokenizer
from agentrl.prompting import encode_prompt
from agentrl.recipe import load_config
from agentrl.sampler.hf import HFSampler

RESULTS = Path(__file__).resolve().parent / "results" / "sampler_replay.csv"


def calls(run: Path, tokenizer) -> list[list[list[int]]]:
    """The prompts of each lock-step generation call of the run's last saved step."""
    path = sorted((run / "rl" / "rollouts").glob("step_*.jsonl.gz"))[-1]
    trajectories = [json.loads(line) for line in gzip.open(path, "rt")]
    longest = max(len(t["steps"]) for t in trajectories)
    return [[encode_prompt(tokenizer, t["steps"][k]["prompt"]) for t in trajectories if len(t["steps"]) > k]
            for k in range(longest)]


def measure(run: Path, repeats: int) -> dict:
    config = load_config(run / "config.yaml")
    model_dir = str(run / "sft" / "model")
    tokenizer, model = load_tokenizer(model_dir), load_model(model_dir, "float32")
    samplers = {"generate": HFSampler(model, tokenizer, share_prefixes=False), "shared": HFSampler(model, tokenizer)}
    seconds = {name: 0.0 for name in samplers}
    same = gap = prompts = distinct = 0
    batches = calls(run, tokenizer)
    for batch in batches:
        best, out = {name: float("inf") for name in samplers}, {}
        for name in [*samplers, *reversed(samplers)] * repeats:
            torch.manual_seed(0)
            start = time.perf_counter()
            out[name] = samplers[name].generate(batch, config.sampling)
            best[name] = min(best[name], time.perf_counter() - start)
        for name in samplers:
            seconds[name] += best[name]
        pairs = list(zip(out["generate"], out["shared"]))
        same += sum(a.token_ids == b.token_ids for a, b in pairs)
        gap = max([gap] + [abs(x - y) for a, b in pairs if a.token_ids == b.token_ids
                           for x, y in zip(a.logprobs, b.logprobs)])
        prompts += len(batch)
        distinct += len({tuple(p) for p in batch})
    return {"run": str(run), "calls": len(batches), "prompts": prompts, "distinct_prompts": distinct,
            "max_new_tokens": config.sampling.max_new_tokens, "generate_s": round(seconds["generate"], 3),
            "shared_s": round(seconds["shared"], 3), "ratio": round(seconds["shared"] / seconds["generate"], 3),
            "same_generations": same, "max_logprob_gap": f"{gap:.1e}"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", type=Path, nargs="+", help="run folders with config.yaml, sft/model and rl/rollouts")
    parser.add_argument("--repeats", type=int, default=1, help="rounds of A B B A per call")
    parser.add_argument("--out", default=str(RESULTS))
    args = parser.parse_args()
    rows = []
    for run in args.runs:
        row = {**measure(run, args.repeats), "threads": torch.get_num_threads(), "torch": torch.__version__,
               "commit": commit()}
        print(row, flush=True)
        rows.append(row)
    append_rows(args.out, rows)


if __name__ == "__main__":
    main()
