"""The GCD papers' Table 1 in miniature: gradient cosine similarity between the mean gradients of
positive / negative samples, in-domain vs out-of-domain, for agent-task samples and for
single-turn arithmetic, with a real pretrained model (SmolLM2-135M-Instruct) on CPU.

    agentrl model import-smollm2 --out runs/smollm2      # once (see README)
    python benchmarks/coupling_table.py --model runs/smollm2 --out runs/coupling_table \
        --alfworld-data ../shared/data/alfworld/alfworld_json_2.1.1_slim.tar.xz

Agent samples are steps of real ALFWorld episodes (and, for comparison, of the built-in household
environment) in the default prompt, one step per episode, the response being the action alone
(a reasoning text shared by every sample would dominate the gradients): positives are expert moves (ALFWorld's
PDDL planner), negatives steps of a random admissible-action policy that GCD's label sources call
bad (the rule: its result recurs later in the episode; the environment: look / inventory /
examine, or inadmissible). In-domain = the four training task types (train split), out-of-domain =
the held-out cool / pick-two types (L2). Arithmetic: "What is a + b?" (in-domain) and "a * b"
(out-of-domain), answered right (positive) or wrong (negative). The paper's pairs: cos(ID set,
OOD set) for nn, np, pn, pp.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

import torch

from agentrl.analysis.coupling import Pair, gradient_similarity
from agentrl.config import PromptConfig
from agentrl.data import play
from agentrl.envs import make_env
from agentrl.envs.alfworld.env import AlfWorldEnvConfig
from agentrl.envs.alfworld.games import L2_TYPES, TASK_TYPES
from agentrl.envs.base import sample_tasks
from agentrl.envs.household.env import HouseholdEnvConfig
from agentrl.gcd.labels import label_steps
from agentrl.models import load_model, load_tokenizer


def agent_sets(env, n: int, seed: int) -> dict[str, list[Pair]]:
    prompt, rng = PromptConfig(), random.Random(seed)
    sets = {k: [] for k in ("pos_id", "neg_id", "pos_ood", "neg_ood")}
    for split, domain in (("train", "id"), ("l2", "ood")):
        for task in sample_tasks(env, split, 200, rng):
            if len(sets[f"pos_{domain}"]) >= n and len(sets[f"neg_{domain}"]) >= n:
                break
            if len(sets[f"pos_{domain}"]) < n:
                expert = play(env, task, prompt, lambda obs: env.expert_action()[1])
                sets[f"pos_{domain}"] += [Pair(s.prompt, s.action, True)
                                          for s in rng.sample(expert.steps, 1)]
            if len(sets[f"neg_{domain}"]) < n:
                random_play = play(env, task, prompt, lambda obs: rng.choice(obs.admissible_actions))
                bad = [x.step for x in label_steps([random_play], ["rules", "env"]) if not x.label]
                sets[f"neg_{domain}"] += [Pair(s.prompt, s.action, False)
                                          for s in rng.sample(bad, min(1, len(bad)))]
    return sets


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
    parser.add_argument("--alfworld-data", help="ALFWorld games (folder or the slim archive; default $ALFWORLD_DATA)")
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    model, tokenizer = load_model(args.model, "float32").eval(), load_tokenizer(args.model)
    alfworld = make_env(AlfWorldEnvConfig(data=args.alfworld_data, max_steps=30,
                                          train_task_types=[t for t in TASK_TYPES if t not in L2_TYPES]))
    try:
        samples = {"ALFWorld agent": agent_sets(alfworld, args.samples, args.seed)}
    finally:
        alfworld.close()
    samples["household agent"] = agent_sets(make_env(HouseholdEnvConfig()), args.samples, args.seed)
    samples["arithmetic"] = math_sets(args.samples, args.seed)
    table = {}
    for name, sets in samples.items():
        sims = gradient_similarity(model, tokenizer, sets)
        table[name] = {"pairs": cross_pairs(sims), "all": sims, "set_sizes": {k: len(v) for k, v in sets.items()}}
        print(name, json.dumps(table[name]["pairs"]), flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "coupling_table.json").write_text(json.dumps({"model": args.model, "samples": args.samples, **table}, indent=2))
    print("| samples | nn | np | pn | pp |\n|---|---|---|---|---|")
    for name, row in table.items():
        print(f"| {name} | " + " | ".join(f"{row['pairs'][k]:.2f}" for k in ("nn", "np", "pn", "pp")) + " |")


if __name__ == "__main__":
    main()
