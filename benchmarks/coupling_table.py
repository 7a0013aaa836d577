"""The GCD papers' Table 1 in miniature: gradient cosine similarity between the mean gradients of
positive / negative samples, in-domain vs out-of-domain, for agent-task samples and for
single-turn arithmetic, with a real pretrained model (SmolLM2-135M-Instruct) on CPU.

    agentrl model import-smollm2 --out runs/smollm2      # once (see README)
    python benchmarks/coupling_table.py --model runs/smollm2 --out runs/coupling_table

Agent samples are built-in household steps in the default ALFWorld-style prompt: positives are
expert moves, negatives random admissible actions the environment labels unhelpful; in-domain =
the four training task types, out-of-domain = the held-out cool / pick-two types. Arithmetic:
"What is a + b?" (in-domain) and "a * b" (out-of-domain), answered right (positive) or wrong
(negative). The paper's pairs: cos(ID set, OOD set) for nn, np, pn, pp.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

import torch

from agentrl.analysis.coupling import Pair, gradient_similarity
from agentrl.config import HouseholdEnvConfig, PromptConfig
from agentrl.data import _play
from agentrl.envs import make_env
from agentrl.envs.base import sample_tasks
from agentrl.models import load_model, load_tokenizer
from agentrl.prompting import format_response


def agent_sets(n: int, seed: int) -> dict[str, list[Pair]]:
    env, prompt, rng = make_env(HouseholdEnvConfig()), PromptConfig(), random.Random(seed)
    sets = {k: [] for k in ("pos_id", "neg_id", "pos_ood", "neg_ood")}
    for split, domain in (("train", "id"), ("l2", "ood")):
        for task in sample_tasks(env, split, 200, rng):
            if len(sets[f"pos_{domain}"]) >= n and len(sets[f"neg_{domain}"]) >= n:
                break
            expert = _play(env, task, prompt, lambda obs: env.expert_action()[1])
            sets[f"pos_{domain}"] += [Pair(s.prompt, format_response("I make progress.", s.action), True)
                                      for s in rng.sample(expert.steps, 1)]
            random_play = _play(env, task, prompt, lambda obs: rng.choice(obs.admissible_actions))
            bad = [s for s in random_play.steps if s.progress is False]
            sets[f"neg_{domain}"] += [Pair(s.prompt, format_response("I make progress.", s.action), False)
                                      for s in rng.sample(bad, min(1, len(bad)))]
    return {k: v[:n] for k, v in sets.items()}


def math_sets(n: int, seed: int) -> dict[str, list[Pair]]:
    rng = random.Random(seed)
    sets = {}
    for domain, symbol, op in (("id", "+", lambda a, b: a + b), ("ood", "*", lambda a, b: a * b)):
        for sign in ("pos", "neg"):
            pairs = []
            for _ in range(n):
                a, b = rng.randint(10, 99), rng.randint(2, 99)
                answer = op(a, b) if sign == "pos" else op(a, b) + rng.choice([-3, -2, -1, 1, 2, 3])
                pairs.append(Pair(f"What is {a} {symbol} {b}? Answer with the number only.", str(answer), sign == "pos"))
            sets[f"{sign}_{domain}"] = pairs
    return sets


def cross_pairs(sims: dict[str, float]) -> dict[str, float]:
    """The paper's four entries: ID set x OOD set."""
    out = {}
    for a in ("neg", "pos"):
        for b in ("neg", "pos"):
            key = f"{a}_id|{b}_ood"
            out[a[0] + b[0]] = sims.get(key, sims.get(f"{b}_ood|{a}_id"))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--samples", type=int, default=16, help="samples per set")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    model, tokenizer = load_model(args.model, "float32").eval(), load_tokenizer(args.model)
    table = {}
    for name, sets in (("household agent", agent_sets(args.samples, args.seed)),
                       ("arithmetic", math_sets(args.samples, args.seed))):
        sims = gradient_similarity(model, tokenizer, sets)
        table[name] = {"pairs": cross_pairs(sims), "all": sims, "set_sizes": {k: len(v) for k, v in sets.items()}}
        print(name, json.dumps(table[name]["pairs"]))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "coupling_table.json").write_text(json.dumps({"model": args.model, "samples": args.samples, **table}, indent=2))
    print("| samples | nn | np | pn | pp |\n|---|---|---|---|---|")
    for name, row in table.items():
        print(f"| {name} | " + " | ".join(f"{row['pairs'][k]:.2f}" for k in ("nn", "np", "pn", "pp")) + " |")


if __name__ == "__main__":
    main()
