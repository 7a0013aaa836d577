"""Supervised fine-tuning on a JSONL chat dataset, loss on assistant tokens only."""

from __future__ import annotations

import random
from pathlib import Path

from agentrl.actor.batch import TrainSample, micro_batches
from agentrl.actor.single import SingleActor
from agentrl.config import ConfigError
from agentrl.data import read_chat_dataset
from agentrl.progress import plain_output, progress, set_stage


def encode_conversation(tokenizer, messages: list[dict], prompt_weight: float = 0.0) -> TrainSample:
    """Context through the chat template, then the final assistant turn + end-of-turn token.

    The two parts are tokenised separately, exactly as at sampling time (prompt encoded, response
    generated), so SFT trains the token sequences the sampler produces. Every trained token
    carries a loss weight: 1 on the response, `prompt_weight` on the context (trained only when
    > 0).
    """
    if messages[-1]["role"] != "assistant":
        raise ValueError(f"the last message must be the assistant's, got {messages[-1]['role']!r}")
    context = tokenizer.apply_chat_template(messages[:-1], tokenize=False, add_generation_prompt=True)
    prompt_ids = tokenizer(context, add_special_tokens=False).input_ids
    response_ids = tokenizer(messages[-1]["content"], add_special_tokens=False).input_ids
    response_ids.append(tokenizer.eos_token_id)
    if prompt_weight <= 0:
        return TrainSample.from_turn(prompt_ids, response_ids, weight=[1.0] * len(response_ids))
    return TrainSample(prompt_ids + response_ids, [False] + [True] * (len(prompt_ids) + len(response_ids) - 1),
                       weight=[prompt_weight] * (len(prompt_ids) - 1) + [1.0] * len(response_ids))


def sft_loss(actor, total_weight: float):
    """Weighted NLL; divided by the whole batch's weight so micro-batching does not matter."""
    def loss_fn(batch):
        logp, _ = actor.token_logprobs(batch)
        weight = batch.weight
        nll = -(weight * logp).sum()
        response = weight == 1.0
        return nll / total_weight, {"nll_sum": -logp[response].sum().detach(), "response_tokens": response.sum()}
    return loss_fn


def train_sft(model, tokenizer, data_path: str | Path, sft_cfg, seed: int, out_dir: Path,
              tracker=None) -> Path:
    samples = [encode_conversation(tokenizer, c, sft_cfg.prompt_loss_weight) for c in read_chat_dataset(data_path)]
    if not samples:
        raise ConfigError(f"{data_path} holds no examples")
    actor = SingleActor(model, sft_cfg.optim)
    rng = random.Random(seed)
    steps_per_epoch = -(-len(samples) // sft_cfg.batch_size)
    step = 0
    with progress() as bar:
        task = bar.add_task("SFT", total=sft_cfg.epochs * steps_per_epoch)
        for epoch in range(sft_cfg.epochs):
            order = samples[:]
            rng.shuffle(order)
            for i in range(0, len(order), sft_cfg.batch_size):
                chunk = order[i:i + sft_cfg.batch_size]
                set_stage(f"SFT step {step + 1}")
                total_weight = sum(sum(s.weight) for s in chunk)
                batches = micro_batches(chunk, sft_cfg.micro_batch_tokens, tokenizer.pad_token_id)
                metrics = actor.optimizer_step([(batches, sft_loss(actor, total_weight))])
                step += 1
                loss = metrics.pop("nll_sum") / metrics.pop("response_tokens")
                if tracker is not None:
                    tracker.log(step, {"sft/loss": loss, "sft/epoch": epoch,
                                       **{f"sft/{k}": v for k, v in metrics.items()}})
                bar.update(task, advance=1, description=f"SFT epoch {epoch + 1} loss {loss:.3f}")
                total = sft_cfg.epochs * steps_per_epoch
                if plain_output() and (step % max(1, total // 20) == 0 or step == total):
                    print(f"SFT step {step}/{total}  epoch {epoch + 1}  loss {loss:.3f}", flush=True)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir
