"""A reviewer's pass waiting for its run (the twelfth, written in session 66): breakages of lines no
mutant in the table breaks, in what a saved result rests on (trajectory records, which `agentrl
compare` and the analysis commands read back; checkpoints, resume and the final export; the
sampler's kept cache across a weight push), written from the source and not the tests, each with
the verdict predicted before any run (committed before the run so that the predictions cannot
follow the results). Run it on a clone, never on a checkout a training run is using:

    git clone -q . ../pass && ln -s $PWD/.venv ../pass/.venv && .venv/bin/python tests/review_pass.py --root ../pass [--only TEXT]

Once run, the results go to docs/tests.md, each survivor gets a test, the breakages join
`mutants.py`, and this file goes.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mutants import COMPARE, FAILURES, TRAINER, Mutant, run  # noqa: E402

P: list[tuple[Mutant, str]] = []
"""Each breakage with its predicted verdict."""


def m(name: str, path: str, old: str, new: str, tests: list[str], prediction: str) -> None:
    P.append((Mutant(name, path, old, new, tests), prediction))


RECORDS = ["test_analysis.py", "test_cli.py", *COMPARE, "test_evaluate.py", "test_full_history.py"]

# --- trajectory records (6)
R = "src/agentrl/rollout/records.py"
m("records: a step's anchor read back as its observation", R,
  'anchor=s.get("anchor") or s["observation"]', 'anchor=s["observation"]', RECORDS, "survives")
m("records: a step's penalty read back as 0", R,
  'penalty=s.get("penalty", 0.0)', "penalty=0.0", RECORDS, "survives")
m("records: an episode's policy version dropped on reading", R,
  'version=row.get("version")', "version=None", [*RECORDS, "test_overlap.py"], "survives")
m("records: an aborted episode read back as finished", R,
  'aborted=row.get("aborted", False)', "aborted=False", RECORDS, "killed")
m("records: the file written in place (a failed write leaves a partial file under its name)", R,
  'tmp = path.with_name(path.name + ".tmp")', "tmp = path", RECORDS, "survives")
m("records: a step's progress flag dropped on reading", R,
  'progress=s.get("progress")', "progress=None", RECORDS, "killed")

# --- checkpoints, resume and export (5)
S = "src/agentrl/actor/single.py"
m("resume: the learning-rate schedule starts over", S,
  'self.scheduler.load_state_dict(saved["scheduler"])', "pass", [*TRAINER, *FAILURES], "survives")
m("resume: bf16 weights' fp32 masters not restored", S,
  "                master.copy_(value)", "                pass", [*TRAINER, *FAILURES, "test_actor.py"], "survives")
m("resume: a LoRA checkpoint of other adapters loaded without a word", S,
  "if result.unexpected_keys:", "if False:", ["test_lora.py", *FAILURES], "survives")
m("export: LoRA adapters copied as the final model, not merged", "src/agentrl/checkpoint.py",
  'if (model / "adapter_config.json").is_file():', "if False:", ["test_lora.py", "test_cli.py"], "killed")
m("checkpoint: the prompt the model was trained for not saved beside it", "src/agentrl/checkpoint.py",
  'save_prompt(prompt, tmp / "model")', "pass", ["test_cli.py", "test_trainer.py", "test_prompting.py"], "survives")

# --- the sampler's kept cache (1)
m("hf sampler: the kept keys and values survive a weight push", "src/agentrl/sampler/hf.py",
  "            self.kept.clear()", "            pass", ["test_full_history.py", "test_trainer.py"], "killed")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--root", type=Path, required=True)
    parser.add_argument("--only", default="")
    parser.add_argument("--timeout", type=int, default=1200)
    args = parser.parse_args()
    for mutant, prediction in P:
        if args.only not in mutant.name:
            continue
        status, seconds, detail = run(mutant, args.root.resolve(), args.timeout)
        print(f"{status:>10}  {seconds:6.0f} s  predicted {prediction:8}  {mutant.name}  {detail}", flush=True)


if __name__ == "__main__":
    main()
