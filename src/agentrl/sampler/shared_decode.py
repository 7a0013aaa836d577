"""Sampling where prompts share their prefixes, in prefill and in every decoding step.

The prompts but their last tokens are prefilled as prefix trees (`agentrl.packing`): each
leading part they share is computed once. Each distinct one's keys and values are then kept once,
and at every decoding step the queries of all its samples meet them in one product (as Hydragen,
arXiv 2402.05099, does): a group of eight samples of one prompt reads that prompt's cache once, not
eight times. A sample's own tokens (its prompt's last, then the ones it samples) sit in a cache of
its own, written in place. The two attentions are merged by their softmax maxima and sums, as
flash-decoding merges the blocks of one. Rows that have finished leave the batch.

Tokens are drawn as Hugging Face `generate` draws them (its warpers, then `torch.multinomial` over
the batch, finished rows given the pad token), so a seeded run samples what `generate` samples.
Decoder models of the Qwen2 and Llama families (pre-norm layers of rotary attention and an MLP);
`supports` says which.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.generation.logits_process import TemperatureLogitsWarper, TopPLogitsWarper
from transformers.models.qwen2.modeling_qwen2 import apply_rotary_pos_emb

from agentrl.packing import (ROW_TOKENS, Packing, TrainSample, collate_rows, packed_chunks, tree_attention,
                                 tree_columns)
from agentrl.distributed import model_device

FAMILIES = ("qwen2", "llama")
QUERIES = 16
"""Most query heads of one prompt's samples in one product with its keys; a prompt with more
samples is met in several."""


def supports(model) -> bool:
    """Whether `model` is one this decoder runs exactly: a Qwen2 or Llama family model, full
    attention in every layer, sdpa or eager attention for the tree prefill."""
    config = model.config
    full = all(kind == "full_attention" for kind in getattr(config, "layer_types", None) or ["full_attention"])
    return (config.model_type in FAMILIES and full and not getattr(config, "use_sliding_window", False)
            and config._attn_implementation in ("sdpa", "eager"))


class PrefixCache:
    """Each distinct prompt prefix's keys and values, once, and which samples read them."""

    def __init__(self, model, prefixes: list[list[int]], owner: list[int], pack: Packing, pad_id: int):
        """`prefixes`: the distinct prompts but their last tokens; `owner[i]`: sample i's prefix."""
        device = model_device(model)
        samples = [TrainSample(p, [False] * len(p)) for p in prefixes]
        width = max(map(len, prefixes))
        chunks = packed_chunks(samples, max(ROW_TOKENS, 2 * width), 10**12, pack)
        rows = chunks[0] if chunks is not None else [[s] for s in samples]
        tree = collate_rows(rows, pad_id).to(device)
        computed = DynamicCache(config=model.config)
        model.get_decoder()(input_ids=tree.input_ids, attention_mask=tree_attention(model, tree.subtree_end),
                            position_ids=tree.position_ids, past_key_values=computed, use_cache=True)
        # Each prefix's tree columns, left-aligned in a (prefixes, width) layout; padding reads
        # column 0 of row 0 and is masked.
        found = {id(s): (r, columns) for r, row in enumerate(rows) for s, columns in zip(row, tree_columns(row))}
        row_of = torch.zeros((len(samples), width), dtype=torch.long)
        column_of = torch.zeros_like(row_of)
        for j, sample in enumerate(samples):
            r, columns = found[id(sample)]
            row_of[j, :len(columns)] = r
            column_of[j, :len(columns)] = torch.tensor(columns, dtype=torch.long)
        # Groups: at most `per` samples of one prefix, padded with a sample index past the last.
        groups_per_head = model.config.num_attention_heads // model.config.num_key_value_heads
        per = max(1, QUERIES // groups_per_head)
        members: list[list[int]] = [[] for _ in prefixes]
        for i, j in enumerate(owner):
            members[j].append(i)
        group_prefix, slots = [], []
        for j, samples_of in enumerate(members):
            for start in range(0, len(samples_of), per):
                part = samples_of[start:start + per]
                group_prefix.append(j)
                slots.append(part + [len(owner)] * (per - len(part)))
        slot = torch.tensor(slots, dtype=torch.long)  # (groups, per)
        flat = {i: k for k, i in enumerate(slot.flatten().tolist())}
        self.slot = slot.to(device)
        self.back = torch.tensor([flat[i] for i in range(len(owner))], dtype=torch.long, device=device)
        group_prefix = torch.tensor(group_prefix, dtype=torch.long)
        lengths = torch.tensor([len(p) for p in prefixes])[group_prefix]
        self.bias = torch.zeros((len(slots), 1, 1, width), device=device)  # (groups, 1, 1, width)
        self.bias.masked_fill_((torch.arange(width) >= lengths[:, None])[:, None, None].to(device), float("-inf"))
        row_of, column_of = row_of[group_prefix].to(device), column_of[group_prefix].to(device)
        self.keys = [layer.keys[row_of, :, column_of].transpose(1, 2) for layer in computed.layers]  # (groups, kv, width, d)
        self.values = [layer.values[row_of, :, column_of].transpose(1, 2) for layer in computed.layers]

    def attend(self, layer: int, query: torch.Tensor, alive: torch.Tensor, mine: torch.Tensor, scaling: float):
        """The queries (alive samples, kv heads, heads per kv head, d) of the samples `alive`
        (their slots `mine`: `back[alive]`) against their prefixes: the unnormalised output, the
        scores' maximum and their exponentials' sum, per query."""
        _, kv, per_kv, d = query.shape
        every = query.new_zeros((self.back.numel() + 1, kv, per_kv, d))  # + the padding slots' zero query
        every[alive] = query
        groups, per = self.slot.shape
        grouped = every[self.slot].permute(0, 2, 1, 3, 4).reshape(groups, kv, per * per_kv, d)
        scores = (grouped @ self.keys[layer].transpose(-1, -2)).float() * scaling + self.bias
        top = scores.amax(-1, keepdim=True)
        weights = torch.exp(scores - top)
        out = weights.to(query.dtype) @ self.values[layer]  # (groups, kv, per * per_kv, d)

        def per_query(x):
            return x.reshape(groups, kv, per, per_kv, -1).permute(0, 2, 1, 3, 4).reshape(groups * per, kv, per_kv, -1)[mine]
        return per_query(out).float(), per_query(top), per_query(weights.sum(-1, keepdim=True))


@torch.no_grad()
def generate(model, prompts: list[list[int]], params, eos_id: int, pad_id: int, pack: Packing
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """Sampled tokens (prompts, steps) and their log-probs under `params.temperature`, every row
    run to the step the last one finished (later tokens `pad_id`). Prompts need two tokens or more."""
    distinct = {}
    owner = [distinct.setdefault(tuple(p[:-1]), len(distinct)) for p in prompts]
    cache = PrefixCache(model, [list(p) for p in distinct], owner, pack, pad_id)
    decoder, head = model.get_decoder(), model.get_output_embeddings()
    device = model_device(model)
    config = model.config
    kv, d = config.num_key_value_heads, decoder.layers[0].self_attn.head_dim
    steps, batch = params.max_new_tokens, len(prompts)
    own_keys = [torch.zeros((batch, kv, steps, d), dtype=model.dtype, device=device) for _ in decoder.layers]
    own_values = [torch.zeros_like(k) for k in own_keys]
    greedy = params.temperature == 0
    temperature = 1.0 if greedy else params.temperature
    warpers = []  # as `generate` chooses them
    if not greedy and temperature != 1.0:
        warpers.append(TemperatureLogitsWarper(temperature))
    if not greedy and params.top_p < 1.0:
        warpers.append(TopPLogitsWarper(params.top_p))

    tokens = torch.tensor([p[-1] for p in prompts], device=device)
    positions = torch.tensor([len(p) - 1 for p in prompts], device=device)
    unfinished = torch.ones(batch, dtype=torch.bool, device=device)
    alive = torch.arange(batch, device=device)  # the rows still sampling: only they are run
    sampled, logprobs = [], []
    for t in range(steps):
        n, mine = len(alive), cache.back[alive]
        hidden = decoder.embed_tokens(tokens[alive][:, None])  # (n, 1, hidden)
        rotary = decoder.rotary_emb(hidden, (positions[alive] + t)[:, None])
        for index, layer in enumerate(decoder.layers):
            attention = layer.self_attn
            x = layer.input_layernorm(hidden)
            q = attention.q_proj(x).view(n, 1, -1, d).transpose(1, 2)  # (n, heads, 1, d)
            k = attention.k_proj(x).view(n, 1, kv, d).transpose(1, 2)
            q, k = apply_rotary_pos_emb(q, k, *rotary)
            own_keys[index][alive, :, t] = k[:, :, 0]
            own_values[index][alive, :, t] = attention.v_proj(x).view(n, kv, d)
            query = q.reshape(n, kv, -1, d)  # query heads grouped by the key head they read
            out, top, total = cache.attend(index, query, alive, mine, attention.scaling)
            scores = (query @ own_keys[index][alive, :, :t + 1].transpose(-1, -2)).float() * attention.scaling
            own_top = scores.amax(-1, keepdim=True)
            weights = torch.exp(scores - own_top)
            own_out = (weights.to(query.dtype) @ own_values[index][alive, :, :t + 1]).float()
            merged = torch.maximum(top, own_top)
            a, b = torch.exp(top - merged), torch.exp(own_top - merged)
            mixed = (out * a + own_out * b) / (total * a + weights.sum(-1, keepdim=True) * b)
            hidden = hidden + attention.o_proj(mixed.to(hidden.dtype).reshape(n, 1, -1))
            hidden = hidden + layer.mlp(layer.post_attention_layernorm(hidden))
        # Finished rows draw too (uniform logits, their token discarded): `generate` samples
        # every row, so the random stream, and each live row's draw, stay the same.
        live = head(decoder.norm(hidden))[:, 0].float()
        logits = live.new_zeros((batch, live.shape[-1]))
        logits[alive] = live
        if greedy:
            chosen = logits.argmax(-1)
        else:
            scores = logits
            for warp in warpers:
                scores = warp(None, scores)
            chosen = torch.multinomial(torch.softmax(scores, -1), num_samples=1).squeeze(1)
        chosen = torch.where(unfinished, chosen, pad_id)
        sampled.append(chosen)
        logprobs.append(torch.log_softmax(logits / temperature, -1).gather(-1, chosen[:, None]).squeeze(-1))
        unfinished &= chosen != eos_id
        if not unfinished.any():
            break
        tokens, alive = chosen, unfinished.nonzero().squeeze(1)
    return torch.stack(sampled, 1), torch.stack(logprobs, 1)
