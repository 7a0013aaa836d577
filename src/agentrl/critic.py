"""The learned critic of PPO: V(s) of a step's state, read at the last token of its prompt.

A separate model (as in verl's PPO): the transformer body of a causal LM (by default the actor's
starting checkpoint) and a linear value head, initialised to zero so V starts at 0. One value per
step sample, so GAE runs over environment steps (`advantages/ppo.py`). The value loss is PPO's
clipped squared error, 0.5 x max((V - R)^2, (V_old + clip(V - V_old, -c, c) - R)^2), averaged
over the mini-batch's step samples.
"""

from __future__ import annotations

import random
import statistics
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModel

from agentrl.components import Component, StepBatch
from agentrl.distributed import device
from agentrl.packing import TrainSample, budget_chunks, collate
from agentrl.seeding import step_seed

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


class Critic(torch.nn.Module):
    def __init__(self, path: str, config, dtype: str = "float32", pad_id: int = 0):
        super().__init__()
        self.config, self.pad_id = config, pad_id
        self.body = AutoModel.from_pretrained(path, dtype=DTYPES[dtype])
        self.head = torch.nn.Linear(self.body.config.hidden_size, 1, dtype=DTYPES[dtype])
        torch.nn.init.zeros_(self.head.weight)
        torch.nn.init.zeros_(self.head.bias)
        self.to(device())
        self.optimizer = torch.optim.AdamW(self.parameters(), lr=config.critic_lr,
                                           weight_decay=config.critic_weight_decay)

    def forward(self, prompts: list[list[int]]) -> torch.Tensor:
        """V (B,) of the prompts, read at each prompt's last token. Each distinct prompt (a state
        several step samples share) runs once; its value, and its gradient, serve all of them."""
        distinct = {tuple(ids): None for ids in prompts}
        index = {ids: i for i, ids in enumerate(distinct)}
        batch = collate([TrainSample(list(ids), [False] * len(ids)) for ids in distinct], self.pad_id
                        ).to(self.head.weight.device)
        hidden = self.body(input_ids=batch.input_ids, attention_mask=batch.attention_mask).last_hidden_state
        last = batch.attention_mask.sum(1) - 1
        values = self.head(hidden[torch.arange(len(distinct), device=last.device), last]).squeeze(-1).float()
        return values[torch.tensor([index[tuple(ids)] for ids in prompts], device=values.device)]

    @torch.no_grad()
    def values(self, prompts: list[list[int]], token_budget: int) -> list[float]:
        self.eval()
        out = [0.0] * len(prompts)
        for part in budget_chunks(range(len(prompts)), token_budget, length=lambda i: len(prompts[i])):
            for i, value in zip(part, self([prompts[i] for i in part]).tolist()):
                out[i] = value
        return out

    def update(self, prompts: list[list[int]], returns: list[float], old_values: list[float],
               mini_batch_size: int, token_budget: int, rng: random.Random) -> dict[str, float]:
        """`critic_epochs` passes of clipped value regression over shuffled mini-batches."""
        self.train()
        c = self.config.value_clip
        order = list(range(len(prompts)))
        totals = {"value_loss": 0.0, "value_clipfrac": 0.0, "grad_norm": 0.0}
        updates = 0
        for _ in range(self.config.critic_epochs):
            rng.shuffle(order)
            for start in range(0, len(order), mini_batch_size):
                idx = order[start:start + mini_batch_size]
                self.optimizer.zero_grad(set_to_none=True)
                for part in budget_chunks(idx, token_budget, length=lambda i: len(prompts[i])):
                    v = self([prompts[i] for i in part])
                    target = torch.tensor([returns[i] for i in part], device=v.device)
                    old = torch.tensor([old_values[i] for i in part], device=v.device)
                    clipped = old + torch.clamp(v - old, -c, c)
                    loss = torch.maximum((v - target) ** 2, (clipped - target) ** 2)
                    (0.5 * loss.sum() / len(idx)).backward()
                    totals["value_loss"] += 0.5 * float(loss.detach().sum()) / len(idx)
                    totals["value_clipfrac"] += float(((clipped - target) ** 2 > (v - target) ** 2).sum()) / len(idx)
                norm = torch.nn.utils.clip_grad_norm_(self.parameters(), self.config.critic_grad_clip)
                if torch.isfinite(norm):
                    self.optimizer.step()
                totals["grad_norm"] += float(norm)
                updates += 1
        return {k: v / max(updates, 1) for k, v in totals.items()}

    def save(self, path: Path) -> None:
        path.mkdir(parents=True, exist_ok=True)
        save_file({k: v.contiguous() for k, v in self.state_dict().items()}, path / "critic.safetensors")
        torch.save(self.optimizer.state_dict(), path / "optimizer.pt")

    def load(self, path: Path) -> None:
        file = path / "critic.safetensors"
        if not file.is_file():
            raise FileNotFoundError(f"checkpoint {path.parent} has no critic ({file} is missing)")
        self.load_state_dict(load_file(file))
        self.optimizer.load_state_dict(torch.load(path / "optimizer.pt", weights_only=True))


def value_metrics(values: list[float], returns: list[float]) -> dict[str, float]:
    """The critic's V before its update against the GAE targets: explained variance
    1 - Var(R - V) / Var(R) (1 is perfect, 0 no better than a constant)."""
    if len(values) < 2:
        return {}
    var = statistics.pvariance(returns)
    residual = statistics.pvariance([r - v for r, v in zip(returns, values)])
    return {"critic/value_mean": statistics.fmean(values), "critic/return_mean": statistics.fmean(returns),
            "critic/explained_variance": 1 - residual / var if var > 0 else 0.0}


class CriticComponent(Component):
    """The critic in the step: V(s) of every step before the advantages (`StepSample.value`), and
    after the actor's update a regression onto the estimator's returns."""

    name = "critic"

    def __init__(self, critic: Critic, mini_batch_size: int, token_budget: int, seed: int):
        self.critic, self.mini_batch_size, self.token_budget, self.seed = critic, mini_batch_size, token_budget, seed

    def score(self, batch: StepBatch) -> None:
        for step, value in zip(batch.steps, self.critic.values([s.prompt_ids for s in batch.steps], self.token_budget)):
            step.value = value

    def after_update(self, batch: StepBatch) -> None:
        if not batch.steps:
            return
        returns = [r for values in batch.advantages.returns for r in values]
        old_values = [s.value for s in batch.steps]
        found = self.critic.update([s.prompt_ids for s in batch.steps], returns, old_values, self.mini_batch_size,
                                   self.token_budget, random.Random(step_seed(self.seed, batch.step, "critic")))
        batch.metrics.update({f"critic/{k}": v for k, v in found.items()})
        batch.metrics.update(value_metrics(old_values, returns))

    def save(self, path: Path) -> None:
        self.critic.save(path)

    def load(self, path: Path) -> None:
        self.critic.load(path)


def critic_components(config, ctx) -> list[Component]:
    """PPO's critic: a separate value model from `critic_path` (default: the actor's start)."""
    critic = Critic(config.critic_path or ctx.model_path, config, ctx.config.model.dtype, ctx.tokenizer.pad_token_id)
    rl = ctx.config.rl
    return [CriticComponent(critic, rl.mini_batch_size, rl.micro_batch_tokens, ctx.config.seed)]
