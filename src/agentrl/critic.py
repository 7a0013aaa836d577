"""The learned critic of PPO: V(s) of a step's state, read at the last token of its prompt.

A separate model (as in verl's PPO): the transformer body of a causal LM (by default the actor's
starting checkpoint) and a linear value head, initialised to zero so V starts at 0. One value per
step sample, so GAE runs over environment steps (`advantages/ppo.py`). The value loss is PPO's
clipped squared error, 0.5 x max((V - R)^2, (V_old + clip(V - V_old, -c, c) - R)^2), averaged
over the mini-batch's step samples.
"""

from __future__ import annotations

import random
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModel

from agentrl.actor.batch import TrainSample, collate
from agentrl.distributed import device

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
        """V (B,) of right-padded prompts, read at each prompt's last token."""
        batch = collate([TrainSample(ids, [False] * len(ids)) for ids in prompts], self.pad_id).to(self.head.weight.device)
        hidden = self.body(input_ids=batch.input_ids, attention_mask=batch.attention_mask).last_hidden_state
        last = batch.attention_mask.sum(1) - 1
        return self.head(hidden[torch.arange(len(prompts), device=last.device), last]).squeeze(-1).float()

    @torch.no_grad()
    def values(self, prompts: list[list[int]], token_budget: int) -> list[float]:
        self.eval()
        out: list[float] = []
        for chunk in _chunks(prompts, token_budget):
            out += self(chunk).tolist()
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
                for part in _chunks(idx, token_budget, key=lambda i: len(prompts[i])):
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


def _chunks(items: list, token_budget: int, key=len):
    """Consecutive groups of items whose padded size (count x longest) stays within the budget."""
    current: list = []
    longest = 0
    for item in items:
        longest_if = max(longest, key(item))
        if current and (len(current) + 1) * longest_if > token_budget:
            yield current
            current, longest_if = [], key(item)
        current.append(item)
        longest = longest_if
    if current:
        yield current
