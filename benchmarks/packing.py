"""Shared prefixes computed once, measured on real RL steps: the same recipe and starting model
trained `--steps` RL steps twice, side by side in one run, with prefix packing and shared
prefill off (every step sample's prompt run on its own, as before) and on (defaults).

Per RL step (medians over the steps of `--repeats` runs per mode, run in the order A B B A):
tokens processed (the samples' tokens) and computed (what
the update's forward passes ran), the step time and its parts (generation, the sampler check,
the update), and each run's peak resident memory; then for how many steps the two runs sampled
the same responses, and how far their final weights are apart (the first sampled token that
differs, by float summation order, sends the runs down different paths). Rows are appended to
benchmarks/results/packing.csv.

    python benchmarks/packing.py --model runs/demo/sft/model                      # the demo's RL
    python benchmarks/packing.py --recipe recipes/testbed.yaml --model runs/testbed/keynoise/coldstart/sft/model \
        --set env.key_choices=4
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file

from agentrl.checkpoint import list_checkpoints
from agentrl.tracking import read_metrics
from results_csv import append_rows, commit

MODES = {"unpacked": "false", "packed": "true"}
PARTS = ["timing_s/gen", "timing_s/actor_logprobs", "timing_s/update"]


def train(recipe: str, model: str, steps: int, overrides: list[str], run_dir: Path, on: str) -> int:
    """One RL run in a child process; its peak resident memory in MiB."""
    sets = [*overrides, f"rl.steps={steps}", f"run_dir={run_dir}", f"rl.pack_prefixes={on}",
            f"rl.sampler.share_prefill={on}", "rl.check_logprobs_every=1", "eval.episodes=1", "eval.splits=[l0]"]
    command = [sys.executable, "-m", "agentrl.cli", "train", recipe, "--model", model,
               *(arg for item in sets for arg in ("--set", item))]
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{' '.join(command)} failed")
    return usage.ru_maxrss // 1024


def responses(run_dir: Path) -> list[list[str]]:
    """Each step's sampled responses, in the order they were saved."""
    steps = sorted((run_dir / "rl" / "rollouts").glob("step_*.jsonl.gz"))
    return [[s["response"] for line in gzip.open(path, "rt") for s in json.loads(line)["steps"]] for path in steps]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--recipe", default="recipes/demo.yaml")
    parser.add_argument("--model", required=True, help="the starting model (e.g. the recipe's SFT model)")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=2, help="runs per mode, in the order A B B A ...")
    parser.add_argument("--set", action="append", default=[], help="recipe override (repeatable)")
    parser.add_argument("--out", default="benchmarks/results/packing.csv")
    args = parser.parse_args()

    runs: dict[str, list[dict]] = {mode: [] for mode in MODES}
    peaks: dict[str, list[int]] = {mode: [] for mode in MODES}
    weights, sampled = {}, {}
    # A B B A: load that drifts during the run (other jobs on the machine) hits both modes alike.
    order = [*MODES, *reversed(MODES)] * (args.repeats // 2) + [*MODES] * (args.repeats % 2)
    with tempfile.TemporaryDirectory() as tmp:
        for i, mode in enumerate(order):
            run_dir = Path(tmp) / f"{mode}{i}"
            peaks[mode].append(train(args.recipe, args.model, args.steps, args.set, run_dir, MODES[mode]))
            runs[mode] += read_metrics(run_dir / "rl" / "logs" / "metrics.jsonl")
            if mode not in weights:
                sampled[mode] = responses(run_dir)
                weights[mode] = load_file(list_checkpoints(run_dir / "rl")[-1] / "model" / "model.safetensors")
    rows = []
    for mode, metrics in runs.items():
        median = {k: statistics.median(m.get(k, 0.0) for m in metrics) for k in
                  ["tokens/processed", "tokens/computed", "timing_s/step", *PARTS]}
        rows.append({"mode": mode, "recipe": args.recipe, "steps": args.steps, "runs": len(peaks[mode]),
                     "overrides": " ".join(args.set),
                     "processed_tokens": round(median["tokens/processed"]),
                     "computed_tokens": round(median["tokens/computed"]),
                     "step_s": round(median["timing_s/step"], 3),
                     **{p.split("/")[1] + "_s": round(median[p], 3) for p in PARTS},
                     "peak_rss_mib": max(peaks[mode])})
    drift = max(float((weights["packed"][n] - w).abs().max()) for n, w in weights["unpacked"].items())
    same = next((i for i, (a, b) in enumerate(zip(sampled["unpacked"], sampled["packed"])) if a != b), args.steps)
    base = rows[0]
    for row in rows:
        row.update({"computed_share": round(row["computed_tokens"] / base["computed_tokens"], 3),
                    "step_time_ratio": round(row["step_s"] / base["step_s"], 3),
                    "same_rollout_steps": same, "max_weight_diff": f"{drift:.1e}", "device": "cpu",
                    "cpu": platform.processor() or platform.machine(), "threads": torch.get_num_threads(),
                    "torch": torch.__version__, "commit": commit()})
        print(row)
    append_rows(args.out, rows)


if __name__ == "__main__":
    main()
