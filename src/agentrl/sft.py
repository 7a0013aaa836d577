"""Supervised fine-tuning on a JSONL chat dataset, loss on assistant tokens only."""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import torch

from agentrl import distributed
from agentrl.actor import SingleActorConfig
from agentrl.checkpoint import checkpoint_dir, latest_checkpoint, read_state, save_checkpoint
from agentrl.config import ConfigError
from agentrl.data import encode_conversation, read_chat_dataset
from agentrl.metrics import LossOutputs
from agentrl.models import add_lora, export_model
from agentrl.packing import Packing, micro_batches
from agentrl.progress import plain_output, progress, set_stage
from agentrl.registry import ACTORS


def sft_loss(actor, total_weight: float):
    """Weighted NLL; divided by the whole batch's weight so micro-batching does not matter."""
    def loss_fn(batch):
        logp, _ = actor.token_logprobs(batch)
        weight = batch.weight
        nll = -(weight * logp).sum()
        response = weight == 1.0
        return LossOutputs(nll / total_weight, counts={"nll_sum": -logp[response].sum().detach(),
                                                       "response_tokens": response.sum()})
    return loss_fn


def sft_policy(model, actor_cfg, seed: int):
    """The model SFT trains with any backend: with the actor's LoRA adapters, where it has them."""
    if actor_cfg.lora is None:
        return model
    torch.manual_seed(seed)  # the adapters' initialisation
    return add_lora(model, actor_cfg.lora)


def train_sft(model, tokenizer, data_path: str | Path, sft_cfg, seed: int, out_dir: Path, tracker=None,
              resume: Path | None = None, settings: dict | None = None, base: str | None = None) -> Path:
    """SFT of `model` on a chat dataset with the actor backend `sft_cfg.actor` (sharded ones on
    every rank of a launch: each rank trains its share of every global batch, the loss divided by
    the whole batch's weight). Checkpoints go to out_dir/checkpoints (every `sft_cfg.save_every`
    steps, or at each epoch's end) with `settings` in their state; `resume`: a checkpoint to
    continue from. Ends with the model as a plain HF folder in `out_dir` (LoRA: merged into
    `base`, by default the adapters' own base) and the checkpoints removed."""
    samples = [encode_conversation(tokenizer, c, sft_cfg.prompt_loss_weight) for c in read_chat_dataset(data_path)]
    if not samples:
        raise ConfigError(f"{data_path} holds no examples")
    actor_cfg = sft_cfg.actor or SingleActorConfig()
    model = sft_policy(model, actor_cfg, seed)
    actor = ACTORS.get(actor_cfg.backend)(actor_cfg, model, sft_cfg.optim, [])
    packing = Packing.for_model(model.config) if sft_cfg.pack_prefixes else None
    rank, world = distributed.rank(), distributed.world()
    start = 0
    if resume is not None:
        actor.load(resume)
        start = read_state(resume)["step"]
    steps_per_epoch = -(-len(samples) // sft_cfg.batch_size)
    total = sft_cfg.epochs * steps_per_epoch
    save_every = sft_cfg.save_every or steps_per_epoch
    rng = random.Random(seed)
    step = 0
    with progress(disable=not distributed.is_main()) as bar:
        task = bar.add_task("SFT", total=total, completed=start)
        for epoch in range(sft_cfg.epochs):
            order = samples[:]
            rng.shuffle(order)  # every epoch's order drawn, also those a resume skips
            for i in range(0, len(order), sft_cfg.batch_size):
                step += 1
                if step <= start:
                    continue
                chunk = order[i:i + sft_cfg.batch_size]
                set_stage(f"SFT step {step}")
                total_weight = sum(sum(s.weight) for s in chunk)
                batches = micro_batches(chunk[rank::world], sft_cfg.micro_batch_tokens, tokenizer.pad_token_id,
                                        packing)
                metrics = actor.optimizer_step([(batches, sft_loss(actor, total_weight))]).report(1, 1)
                loss = metrics.pop("nll_sum") / metrics.pop("response_tokens")
                if tracker is not None:
                    tracker.log(step, {"sft/loss": loss, "sft/epoch": epoch,
                                       **{f"sft/{k}": v for k, v in metrics.items()}})
                bar.update(task, advance=1, description=f"SFT epoch {epoch + 1} loss {loss:.3f}")
                if plain_output() and distributed.is_main() and (step % max(1, total // 20) == 0 or step == total):
                    print(f"SFT step {step}/{total}  epoch {epoch + 1}  loss {loss:.3f}", flush=True)
                if step % save_every == 0 or step == total:
                    save_checkpoint(out_dir, step, actor, tokenizer, {"epoch": epoch, "settings": settings},
                                    keep_last=1)
    final = latest_checkpoint(out_dir)
    if distributed.is_main():
        adapter = final / "model" / "adapter_config.json"
        if adapter.is_file():
            export_model(final, out_dir, base, dtype=next(model.parameters()).dtype)
        else:
            for item in (final / "model").iterdir():
                shutil.copy2(item, out_dir / item.name)
        shutil.rmtree(checkpoint_dir(out_dir))
    distributed.barrier()
    return out_dir
