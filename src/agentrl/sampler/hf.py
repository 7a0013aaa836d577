"""Sampling with Hugging Face `generate`: the CPU sampler, batched over all active episodes."""

from __future__ import annotations

from typing import Iterable

import torch
from transformers import DynamicCache

from agentrl.actor.batch import (ROW_TOKENS, Packing, TrainSample, collate_rows, packed_chunks, tree_attention,
                                 tree_columns)
from agentrl.distributed import model_device
from agentrl.sampler.base import Generation


class HFSampler:
    def __init__(self, model, tokenizer, share_prefill: bool = True):
        """`share_prefill`: the prompts of a batch are prefilled as prefix trees, each leading part
        they share (a group's task, a recurring state) computed once, and the key-value cache
        gathered for each of their samples; then `generate` continues from it."""
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
        """The key-value cache of every prompt but its last token, the prompts packed as prefix
        trees as the update packs step samples (`agentrl.actor.batch`): each leading part they
        share is computed once. None when that is modelled no cheaper than prefilling them apart
        (`packed_chunks`). `generate` then runs only the last token of each."""
        if min(map(len, prompts)) < 2:
            return None
        width = input_ids.shape[1]
        samples = [TrainSample(p[:-1], [False] * (len(p) - 1)) for p in prompts]
        chunks = packed_chunks(samples, max(ROW_TOKENS, 2 * width), 10**12, Packing.for_model(self.model.config))
        if chunks is None:
            return None
        rows = chunks[0]
        device = input_ids.device
        tree = collate_rows(rows, self.pad_id).to(device)
        computed = DynamicCache(config=self.model.config)
        self.model.get_decoder()(input_ids=tree.input_ids, attention_mask=tree_attention(self.model, tree.subtree_end),
                                 position_ids=tree.position_ids, past_key_values=computed, use_cache=True)
        # Each prompt's columns of the tree, right-aligned in the left-padded layout of `generate`
        # (its padding reads column 0 of row 0, which the attention mask hides).
        found = {id(s): (r, columns) for r, row in enumerate(rows) for s, columns in zip(row, tree_columns(row))}
        row_of = torch.zeros((len(prompts), width - 1), dtype=torch.long)
        column_of = torch.zeros_like(row_of)
        for i, sample in enumerate(samples):
            r, columns = found[id(sample)]
            row_of[i, width - 1 - len(columns):] = r
            column_of[i, width - 1 - len(columns):] = torch.tensor(columns, dtype=torch.long)
        row_of, column_of = row_of.to(device), column_of.to(device)
        cache = DynamicCache(config=self.model.config)
        for index, layer in enumerate(computed.layers):  # keys, values: (rows, heads, columns, head_dim)
            cache.update(layer.keys[row_of, :, column_of].transpose(1, 2),  # (B, heads, width - 1, head_dim)
                         layer.values[row_of, :, column_of].transpose(1, 2), index)
        return cache
