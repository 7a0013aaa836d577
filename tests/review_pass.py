"""Reviewer's pass 27 (issue 45): single breakages written apart from the suite, each with the
verdict predicted before the run, on modules with few mutants per line: model loading and the
tiny model's tokenizer, the step batch's advantages, ALFWorld's notebook and observer, and the
FSDP2 actor's scores, clip and skipped updates. Run on a clone:
    PYTEST_ADDOPTS="-n 2" .venv/bin/python tests/review_pass.py --root ../pass
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mutants import MUTANTS, Mutant, run  # noqa: E402

MODELS = "src/agentrl/models.py"
BATCH = "src/agentrl/components.py"
OBSERVER = "src/agentrl/envs/alfworld/observer.py"
FSDP = "src/agentrl/actor/fsdp.py"
LOADING = ["test_models.py", "test_cli.py", "test_failures.py"]
STEP = ["test_trainer.py", "test_nthr.py", "test_plugins.py"]
ALFWORLD = ["test_alfworld.py", "test_dagger.py"]
SHARDED = ["test_distributed.py"]

# (mutant, predicted verdict)
PASS = [
    # model loading and the tiny model's tokenizer
    (Mutant("models: a folder without config.json taken as a model", MODELS,
            'if not (local / "config.json").is_file():', "if False:", LOADING), "killed"),
    (Mutant("models: a path that only starts like a hub id sent to the hub", MODELS,
            "if not HUB_ID.fullmatch(path):", "if not HUB_ID.match(path):", LOADING), "survived"),
    (Mutant("models: HF_HUB_OFFLINE=true not honoured", MODELS,
            'if os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False"):',
            'if os.environ.get("HF_HUB_OFFLINE", "0") == "1":', LOADING), "survived"),
    (Mutant("models: a tokenizer without a pad token left without one", MODELS,
            "    if tokenizer.pad_token is None:\n        tokenizer.pad_token = tokenizer.eos_token\n", "",
            LOADING + ["test_smollm2.py"]), "survived"),
    (Mutant("init: the tokenizer trained without the byte alphabet", MODELS,
            "initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),\n", "\n", LOADING), "survived"),
    (Mutant("init: the tokenizer's corpus played on the train split only", MODELS,
            "sample_tasks(env, SPLITS[i % len(SPLITS)], 1, rng)", 'sample_tasks(env, "train", 1, rng)', LOADING),
            "survived"),
    (Mutant("init: the tokenizer's text not NFC-normalised", MODELS, "    bpe.normalizer = normalizers.NFC()\n", "",
            LOADING), "survived"),
    # the step batch
    (Mutant("step batch: advantages for fewer steps than the batch's handed out silently", BATCH,
            "for step, a in zip(self.steps, flat, strict=True):", "for step, a in zip(self.steps, flat):", STEP),
            "survived"),
    # ALFWorld's notebook and observer
    (Mutant("notebook: 'and' before the last object seen kept in its name", OBSERVER,
            r're.split(r",|\band\b", listed)', 're.split(r",", listed)', ALFWORLD), "killed"),
    (Mutant("notebook: a move that did nothing recorded", OBSERVER,
            'if action is None or feedback.startswith("Nothing happens"):', "if action is None:", ALFWORLD),
            "survived"),
    (Mutant("notebook: receptacles in name order (cabinet 10 before cabinet 2)", OBSERVER,
            "sorted(seen_objects(first_observation), key=lambda r: (kind_of(r), number_of(r)))",
            "sorted(seen_objects(first_observation))", ALFWORLD), "survived"),
    (Mutant("notebook: objects gone from a receptacle still listed there when it is seen again", OBSERVER,
            "        for obj in [o for o, r in self.where.items() if r == recep]:\n            del self.where[obj]\n", "",
            ALFWORLD), "survived"),
    (Mutant("notebook: what the admissible actions offer to take not noted as seen", OBSERVER,
            "for command in admissible:  # what can be taken from here is in sight", "for command in []:",
            ALFWORLD), "survived"),
    (Mutant("observer: a pick-two's second object taken from where the first was put", OBSERVER,
            "\n              and not (pick_two and placed and book.where[o] in {r for _, r in book.placed})", "",
            ALFWORLD), "survived"),
    (Mutant("observer: a receptacle sharing the agent's spot gone to, not opened", OBSERVER,
            'if candidates and f"go to {candidates[0]}" not in admissible and f"open {candidates[0]}" in admissible:',
            "if False:", ALFWORLD), "survived"),
    # the FSDP2 actor
    (Mutant("fsdp2: a rank's padding repeats' scores returned with its own", FSDP,
            "return scores[:len(batches)]", "return scores", SHARDED), "survived"),
    (Mutant("fsdp2: rl.optim.grad_clip ignored (always 1)", FSDP,
            "self.model, self.grad_clip = model, optim.grad_clip", "self.model, self.grad_clip = model, 1.0", SHARDED),
            "survived"),
    (Mutant("fsdp2: a non-finite update applied", FSDP, "        if finite:\n            self.optimizer.step()",
            "        if True:\n            self.optimizer.step()", SHARDED), "survived"),
]


def unbroken(mutant: Mutant, root: Path) -> None:
    """The breakage's line is one no mutant in the table touches, and it applies once."""
    for known in MUTANTS:
        if known.path == mutant.path and (mutant.old in known.old or known.old in mutant.old):
            raise SystemExit(f"{mutant.name}: the table's '{known.name}' breaks the same line")
    count = (root / mutant.path).read_text().count(mutant.old)
    if count != 1:
        raise SystemExit(f"{mutant.name}: the line occurs {count} times")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--root", type=Path, required=True)
    parser.add_argument("--check", action="store_true", help="only check each breakage applies")
    args = parser.parse_args()
    root = args.root.resolve()
    for mutant, _ in PASS:
        unbroken(mutant, root)
    if args.check:
        return 0
    killed = right = 0
    for mutant, predicted in PASS:
        status, seconds, detail = run(mutant, root, 1200)
        verdict = "killed" if status.startswith("killed") else status
        killed += verdict == "killed"
        right += verdict == predicted
        print(f"{verdict:>10} (predicted {predicted:>8})  {seconds:5.0f} s  {mutant.name}  {detail}", flush=True)
    print(f"killed {killed} of {len(PASS)}; {right} predicted right")
    return 0


if __name__ == "__main__":
    sys.exit(main())
