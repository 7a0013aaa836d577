"""Sampling from an HF model in the trainer's process: the CPU sampler, batched over all active
episodes, with the shared-prefix decoder (`shared_decode`) or Hugging Face `generate`."""

from __future__ import annotations

from typing import Iterable

import torch

from agentrl.distributed import model_device
from agentrl.errors import RunError
from agentrl.packing import Packing
from agentrl.sampler import shared_decode
from agentrl.sampler.base import Generation


class HFSampler:
    def __init__(self, model, tokenizer, share_prefixes: bool = True, keep_mib: float = 0):
        """`share_prefixes`: the prompts of a batch are prefilled as prefix trees, each leading part
        they share (a group's task, a recurring state) computed once, and each decoding step reads
        each distinct prompt's cache once for all its samples (`shared_decode`), for the model
        families it supports; otherwise, and with `share_prefixes` false, `generate` runs them.
        `keep_mib` > 0 (with the shared decoder): each prompt's and reply's keys and values are
        kept across calls in up to that many MiB (`shared_decode.KeptCache`), so an episode's
        next turn prefills only its new tokens."""
        self.model = model
        self.pad_id = tokenizer.pad_token_id
        self.eos_id = tokenizer.eos_token_id
        self.share_prefixes = share_prefixes and shared_decode.supports(model)
        self.packing = Packing.for_model(model.config)
        self.kept = shared_decode.KeptCache(model, keep_mib) if keep_mib > 0 and self.share_prefixes else None
        self.context_length = getattr(model.config, "max_position_embeddings", None)

    def sleep(self) -> None:
        """The kept keys and values go (the weights are about to change); the model is the
        actor's own, or a plain copy."""
        if self.kept is not None:
            self.kept.clear()

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
        self._check_context(max(map(len, prompts)) + params.max_new_tokens)
        was_training = self.model.training
        self.model.eval()
        if self.share_prefixes and min(map(len, prompts)) >= 2:
            tokens, logprobs = shared_decode.generate(self.model, prompts, params, self.eos_id, self.pad_id,
                                                      self.packing, self.kept)
        else:
            tokens, logprobs = self._generate(prompts, params)
        self.model.train(was_training)
        results = []
        for row in range(len(prompts)):
            ids = tokens[row].tolist()
            length = ids.index(self.eos_id) + 1 if self.eos_id in ids else len(ids)
            results.append(Generation(ids[:length], logprobs[row, :length].tolist()))
        return results

    def _check_context(self, length: int) -> None:
        """A prompt and its reply past the model's positions would be sampled beyond what it was
        trained on (no error from the model itself): refused, with the way out."""
        limit = self.context_length
        if limit is not None and length > limit:
            raise RunError(f"a prompt with its reply reaches {length} tokens, past the model's {limit} positions "
                           f"(max_position_embeddings): a shorter prompt or sampling.max_new_tokens, or a model "
                           f"with a longer context")

    def _generate(self, prompts: list[list[int]], params) -> tuple[torch.Tensor, torch.Tensor]:
        """(tokens, their log-probs), each (prompts, steps), from `generate` on the left-padded prompts."""
        width = max(map(len, prompts))
        input_ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)  # (B, L) left-padded
        attention = torch.zeros_like(input_ids)
        for row, ids in enumerate(prompts):
            input_ids[row, width - len(ids):] = torch.tensor(ids)
            attention[row, width - len(ids):] = 1
        greedy = params.temperature == 0
        device = model_device(self.model)
        out = self.model.generate(
            input_ids=input_ids.to(device), attention_mask=attention.to(device), do_sample=not greedy,
            temperature=None if greedy else params.temperature, top_p=None if greedy else params.top_p,
            top_k=0 if not greedy else None, max_new_tokens=params.max_new_tokens,
            eos_token_id=self.eos_id, pad_token_id=self.pad_id,
            output_logits=True, return_dict_in_generate=True,
        )
        tokens = out.sequences[:, width:]  # (B, T)
        temperature = 1.0 if greedy else params.temperature
        # One step at a time: never a (B, T, V) float tensor.
        logprobs = torch.stack([
            torch.log_softmax(step.float() / temperature, -1).gather(-1, tokens[:, t:t + 1]).squeeze(-1)
            for t, step in enumerate(out.logits)
        ], dim=1)  # (B, T)
        return tokens, logprobs
