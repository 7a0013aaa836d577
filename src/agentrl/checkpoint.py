"""Atomic checkpoints: written to a temporary folder, then renamed into place.

A crash while saving leaves the previous checkpoint intact; the last `keep_last` are kept.
Layout: checkpoints/step_000010/{model/ (HF folder), optimizer.pt, trainer_state.json, and one
folder per extra trained part: critic/ (PPO), gcd/ (a GCD classifier head)}. At the end of a
run the last one is exported as a plain Hugging Face folder, model/ (`export_final`).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from agentrl import distributed
from agentrl.prompting import save_prompt


def checkpoint_dir(run_dir: Path) -> Path:
    return run_dir / "checkpoints"


def save_checkpoint(run_dir: Path, step: int, actor, tokenizer, state: dict, keep_last: int,
                    parts: dict | None = None, prompt=None) -> Path:
    """`parts`: name -> object with save(path) / load(path), each saved into its own folder;
    `prompt` (PromptConfig): saved beside the model, which is trained for it.
    With several ranks every rank calls this (a sharded actor writes its own shards); rank 0
    writes the rest and renames the finished folder into place."""
    root = checkpoint_dir(run_dir)
    final = root / f"step_{step:06d}"
    tmp = root / f".tmp-step_{step:06d}"
    main = distributed.is_main()
    if main:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    distributed.barrier()
    actor.save(tmp)
    if main:
        tokenizer.save_pretrained(tmp / "model")
        if prompt is not None:
            save_prompt(prompt, tmp / "model")
        for name, part in (parts or {}).items():
            part.save(tmp / name)
        (tmp / "trainer_state.json").write_text(json.dumps({"step": step, **state}, indent=2))
        if final.exists():
            shutil.rmtree(final)
        tmp.rename(final)
        for old in list_checkpoints(run_dir)[:-keep_last]:
            shutil.rmtree(old)
    distributed.barrier()
    return final


def list_checkpoints(run_dir: Path) -> list[Path]:
    root = checkpoint_dir(run_dir)
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.name.startswith("step_") and
                  (p / "trainer_state.json").is_file())


def latest_checkpoint(run_dir: Path) -> Path | None:
    found = list_checkpoints(run_dir)
    return found[-1] if found else None


def read_state(path: Path) -> dict:
    return json.loads((path / "trainer_state.json").read_text())


def export_final(run_dir: Path, base: str, dtype: str) -> Path:
    """The last checkpoint as a plain Hugging Face folder, run_dir/model, that
    `AutoModelForCausalLM.from_pretrained` and vLLM load (LoRA adapters merged into `base`, the
    model they were trained on, in `dtype`; full weights copied as saved); it takes that name only
    when written whole."""
    import torch

    from agentrl.models import export_model
    final, tmp, model = run_dir / "model", run_dir / "model.tmp", latest_checkpoint(run_dir) / "model"
    shutil.rmtree(tmp, ignore_errors=True)
    if (model / "adapter_config.json").is_file():
        export_model(model, tmp, base, getattr(torch, dtype))
    else:
        shutil.copytree(model, tmp)
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    return final
