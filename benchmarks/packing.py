"""Shared prefixes computed once, measured on real RL steps: the same recipe and starting model
trained `--steps` RL steps twice, side by side in one run, with prefix packing and the sampler's
sharing off (every step sample's prompt run on its own, HF `generate`: as before) and on
(defaults).

Per RL step (medians over the steps of `--repeats` runs per mode, run in the order A B B A):
tokens processed (the samples' tokens) and computed (what
the update's forward passes ran), the step time and its parts (generation, the sampler check,
the update), and each run's peak resident memory; then for how many steps the two runs sampled
the same responses, and how far their final weights are apart (the first sampled token that
differs, by float summation order, sends the runs down different paths). The shared-prefix
decoder's float arithmetic is not `generate`'s, so the sampler's log-probs (the loss's old
log-probs) differ from it by a few 1e-6 as well; one more run, an unpacked update beside the
shared sampler, isolates the update: `same_sampler_*` compare it with the packed run. Rows are
appended to benchmarks/results/packing.csv.

    python benchmarks/packing.py --model runs/demo/sft/model                      # the demo's RL
    python benchmarks/packing.py --model runs/demo/sft/model --set rl.mini_batch_order=grouped \
        --baseline 08ea09d^                         # and the code the shared-prefix issue was filed at
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

MODES = {"unpacked": ("false", "false"), "packed": ("true", "true")}  # (rl.pack_prefixes, rl.sampler.share_prefixes)
SAME_SAMPLER = ("false", "true")  # an unpacked update beside the packed one's sampler: the weights check
BASELINE = "at-issue"
PARTS = ["timing_s/gen", "timing_s/actor_logprobs", "timing_s/update"]


def train(recipe: str, model: str, sets: list[str], run_dir: Path, source: Path | None = None) -> int:
    """One RL run in a child process (of the code in `source`/src when given); its peak resident
    memory in MiB."""
    command = [sys.executable, "-m", "agentrl.cli", "train", recipe, "--model", model,
               *(arg for item in [*sets, f"run_dir={run_dir}"] for arg in ("--set", item))]
    env = {**os.environ, "PYTHONPATH": str(source / "src")} if source else None
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, env=env)
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
    parser.add_argument("--baseline", metavar="COMMIT",
                        help="also time the code of COMMIT (a git worktree) with its own recipe and no --set: "
                             f"the mode {BASELINE!r}, e.g. the commit the issue was filed at")
    parser.add_argument("--out", default="benchmarks/results/packing.csv")
    args = parser.parse_args()

    common = [f"rl.steps={args.steps}", "rl.check_logprobs_every=1", "eval.episodes=1", "eval.splits=[l0]"]

    def sets(pack_share):
        pack, share = pack_share
        return [*args.set, *common, f"rl.pack_prefixes={pack}", f"rl.sampler.share_prefixes={share}"]

    modes = [*MODES] + [BASELINE] * bool(args.baseline)
    runs: dict[str, list[dict]] = {mode: [] for mode in modes}
    peaks: dict[str, list[int]] = {mode: [] for mode in modes}
    weights, sampled = {}, {}
    # A B C C B A: load that drifts during the run (other jobs on the machine) hits every mode alike.
    order = [*modes, *reversed(modes)] * (args.repeats // 2) + modes * (args.repeats % 2)
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "baseline"
        if args.baseline:
            subprocess.run(["git", "worktree", "add", "--detach", "-q", str(source), args.baseline], check=True)
        try:
            for i, mode in enumerate(order):
                run_dir = Path(tmp) / f"{mode}{i}"
                if mode == BASELINE:
                    peaks[mode].append(train(str(source / args.recipe), args.model, common, run_dir, source))
                else:
                    peaks[mode].append(train(args.recipe, args.model, sets(MODES[mode]), run_dir))
                runs[mode] += read_metrics(run_dir / "rl" / "logs" / "metrics.jsonl")
                if mode in MODES and mode not in weights:
                    sampled[mode] = responses(run_dir)
                    weights[mode] = load_file(list_checkpoints(run_dir / "rl")[-1] / "model" / "model.safetensors")
        finally:
            if args.baseline:
                subprocess.run(["git", "worktree", "remove", "--force", str(source)], check=True)
        run_dir = Path(tmp) / "same-sampler"
        train(args.recipe, args.model, sets(SAME_SAMPLER), run_dir)
        sampled["same-sampler"] = responses(run_dir)
        weights["same-sampler"] = load_file(list_checkpoints(run_dir / "rl")[-1] / "model" / "model.safetensors")
    rows = []
    for mode, metrics in runs.items():
        for m in metrics:  # code from before packing logs no computed tokens: it computed them all
            m.setdefault("tokens/computed", m["tokens/processed"])
        median = {k: statistics.median(m.get(k, 0.0) for m in metrics) for k in
                  ["tokens/processed", "tokens/computed", "timing_s/step", *PARTS]}
        rows.append({"mode": mode, "recipe": args.recipe, "steps": args.steps, "runs": len(peaks[mode]),
                     "overrides": "" if mode == BASELINE else " ".join(args.set),
                     "processed_tokens": round(median["tokens/processed"]),
                     "computed_tokens": round(median["tokens/computed"]),
                     "step_s": round(median["timing_s/step"], 3),
                     **{p.split("/")[1] + "_s": round(median[p], 3) for p in PARTS},
                     "peak_rss_mib": max(peaks[mode])})
    def drift(other):
        return f'{max(float((weights["packed"][n] - w).abs().max()) for n, w in weights[other].items()):.1e}'

    def same(other):
        return next((i for i, (a, b) in enumerate(zip(sampled[other], sampled["packed"])) if a != b), args.steps)

    base = rows[0]
    at_issue = rows[-1]["step_s"] if args.baseline else None
    for row in rows:
        row.update({"computed_share": round(row["computed_tokens"] / base["computed_tokens"], 3),
                    "step_time_ratio": round(row["step_s"] / base["step_s"], 3),
                    "vs_at_issue": round(row["step_s"] / at_issue, 3) if at_issue else "",
                    "baseline": args.baseline or "",
                    **({"same_rollout_steps": "", "max_weight_diff": ""} if row["mode"] == BASELINE else
                       {"same_rollout_steps": same("unpacked"), "max_weight_diff": drift("unpacked"),
                        "same_sampler_rollout_steps": same("same-sampler"),
                        "same_sampler_weight_diff": drift("same-sampler")}),
                    "device": "cpu",
                    "cpu": platform.processor() or platform.machine(), "threads": torch.get_num_threads(),
                    "torch": torch.__version__, "commit": commit()})
        print(row)
    append_rows(args.out, rows)


if __name__ == "__main__":
    main()
