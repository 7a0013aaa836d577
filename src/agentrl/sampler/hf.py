"""Sampling with Hugging Face `generate`: the CPU sampler, batched over all active episodes."""

from __future__ import annotations

from typing import Iterable

import torch
from transformers import DynamicCache

from agentrl.distributed import model_device
from agentrl.sampler.base import Generation


class HFSampler:
    def __init__(self, model, tokenizer, share_prefill: bool = True):
        """`share_prefill`: identical prompts of a batch are prefilled once, their key-value cache
        copied to each of their samples (the rollouts of a group see the same first observation,
        and states recur), then `generate` continues from it."""
        self.model = model
        self.pad_id = tokenizer.pad_token_id
        self.eos_id = tokenizer.eos_token_id
        self.share_prefill = share_prefill

    def sleep(self) -> None:
        """Nothing to release: the model is the actor's own, or a plain copy."""

    def update_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        params = self.model.state_dict()  # every name, tied ones too (they share storage)
        with torch.no_grad():
            for name, tensor in weights:
                if params[name].data_ptr() != tensor.data_ptr():
                    params[name].copy_(tensor)

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], params) -> list[Generation]:
        if not prompts:
            return []
        width = max(map(len, prompts))
        input_ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)  # (B, L) left-padded
        attention = torch.zeros_like(input_ids)
        for row, ids in enumerate(prompts):
            input_ids[row, width - len(ids):] = torch.tensor(ids)
            attention[row, width - len(ids):] = 1
        greedy = params.temperature == 0
        was_training = self.model.training
        self.model.eval()
        device = model_device(self.model)
        input_ids, attention = input_ids.to(device), attention.to(device)
        cache = self._shared_prefill(prompts, input_ids, attention) if self.share_prefill else None
        out = self.model.generate(
            input_ids=input_ids, attention_mask=attention, past_key_values=cache, do_sample=not greedy,
            temperature=None if greedy else params.temperature, top_p=None if greedy else params.top_p,
            top_k=0 if not greedy else None, max_new_tokens=params.max_new_tokens,
            eos_token_id=self.eos_id, pad_token_id=self.pad_id,
            output_logits=True, return_dict_in_generate=True,
        )
        self.model.train(was_training)
        tokens = out.sequences[:, width:]  # (B, T)
        temperature = 1.0 if greedy else params.temperature
        # One step at a time: never a (B, T, V) float tensor.
        logprobs = torch.stack([
            torch.log_softmax(step.float() / temperature, -1).gather(-1, tokens[:, t:t + 1]).squeeze(-1)
            for t, step in enumerate(out.logits)
        ], dim=1)  # (B, T)
        results = []
        for row in range(len(prompts)):
            ids = tokens[row].tolist()
            length = ids.index(self.eos_id) + 1 if self.eos_id in ids else len(ids)
            results.append(Generation(ids[:length], logprobs[row, :length].tolist()))
        return results

    def _shared_prefill(self, prompts, input_ids, attention):
        """The key-value cache of every prompt but its last token, each distinct prompt computed
        once (None when all are distinct): `generate` then runs only the last token of each."""
        distinct: dict[tuple[int, ...], int] = {}
        first = [distinct.setdefault(tuple(p), row) for row, p in enumerate(prompts)]
        if len(distinct) == len(prompts) or input_ids.shape[1] < 2:
            return None
        rows = torch.tensor(list(distinct.values()), device=input_ids.device)
        ids, mask = input_ids[rows, :-1], attention[rows, :-1]  # (U, L - 1), left-padded
        positions = (mask.cumsum(-1) - 1).clamp(min=0)  # as generate numbers left-padded rows
        cache = DynamicCache(config=self.model.config)
        self.model(input_ids=ids, attention_mask=mask, position_ids=positions, past_key_values=cache, use_cache=True)
        slot = {row: k for k, row in enumerate(distinct.values())}
        cache.reorder_cache(torch.tensor([slot[row] for row in first], device=input_ids.device))
        return cache
