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

from collections import OrderedDict

import torch
from transformers import DynamicCache
from transformers.generation.logits_process import TemperatureLogitsWarper, TopPLogitsWarper
from transformers.models.qwen2.modeling_qwen2 import apply_rotary_pos_emb

from agentrl.packing import (ROW_TOKENS, Packing, TrainSample, budget_chunks, collate_rows, packed_chunks,
                             tree_attention, tree_columns)
from agentrl.distributed import model_device

FAMILIES = ("qwen2", "llama")
QUERIES = 16
"""Most query heads of one prompt's samples in one product with its keys; a prompt with more
samples is met in several."""
PREFILL_TOKENS = 8192
"""Most padded tokens one prefill forward computes. Its memory grows with them and its attention
with the square of a row's length: on issue 40's 2-layer model, 16-26 KB a token (8,000 tokens at
once 0.82 GiB, 16 prompts of 4,000 2.10 GiB), so 200 long episodes prefilled together would need
tens of GB."""


def supports(model) -> bool:
    """Whether `model` is one this decoder runs exactly: of a family it runs (`runs_family`), with
    sdpa or eager attention for the tree prefill."""
    return runs_family(model.config.to_dict()) and model.config._attn_implementation in ("sdpa", "eager")


def runs_family(config: dict) -> bool:
    """Whether a model of this config.json is a Qwen2 or Llama family model with full attention in
    every layer."""
    full = all(kind == "full_attention" for kind in config.get("layer_types") or ["full_attention"])
    return config.get("model_type") in FAMILIES and full and not config.get("use_sliding_window", False)


def tree_prefill(model, prefixes: list[list[int]], pack: Packing, pad_id: int, budget: int = PREFILL_TOKENS
                 ) -> list[list[tuple]]:
    """Each prefix's keys and values, (kv heads, its length, head dim) per layer, the prefixes
    prefilled as prefix trees (each leading part they share computed once), in forwards of at most
    `budget` padded tokens (a longer prefix alone)."""
    device = model_device(model)
    samples = [TrainSample(p, [False] * len(p)) for p in prefixes]
    max_row = min(budget, max(ROW_TOKENS, 2 * max(map(len, prefixes))))
    chunks = packed_chunks(samples, max_row, budget, pack)
    if chunks is None:
        chunks = [[[s] for s in chunk] for chunk in budget_chunks(samples, budget)]
    found = {}
    for rows in chunks:
        tree = collate_rows(rows, pad_id).to(device)
        computed = DynamicCache(config=model.config)
        model.get_decoder()(input_ids=tree.input_ids, attention_mask=tree_attention(model, tree.subtree_end),
                            position_ids=tree.position_ids, past_key_values=computed, use_cache=True)
        for r, row in enumerate(rows):
            for sample, columns in zip(row, tree_columns(row)):
                index = torch.tensor(columns, dtype=torch.long, device=device)
                found[id(sample)] = [(layer.keys[r, :, index], layer.values[r, :, index]) for layer in computed.layers]
    return [found[id(sample)] for sample in samples]


def extend(model, pasts: list[list[tuple]], news: list[list[int]], budget: int = PREFILL_TOKENS
           ) -> list[list[tuple]]:
    """The keys and values of each past followed by its new tokens, per layer: the new tokens
    computed in batches of at most `budget` padded past and new tokens (a longer one alone), each
    reading its own past (a kept episode's next turn)."""
    out: list = [None] * len(pasts)
    fresh = max(map(len, news))  # a batch's width is its longest past and its longest new tokens
    sizes = [past[0][0].shape[1] + fresh for past in pasts]
    for group in budget_chunks(range(len(pasts)), budget, sizes.__getitem__):
        for b, state in zip(group, _extend(model, [pasts[b] for b in group], [news[b] for b in group])):
            out[b] = state
    return out


def _extend(model, pasts: list[list[tuple]], news: list[list[int]]) -> list[list[tuple]]:
    """`extend` in one batch."""
    device = model_device(model)
    lengths = [past[0][0].shape[1] for past in pasts]
    width, fresh = max(lengths), max(map(len, news))
    mask = torch.zeros((len(news), width + fresh), dtype=torch.long, device=device)  # (B, past + new)
    input_ids = torch.zeros((len(news), fresh), dtype=torch.long, device=device)
    positions = torch.zeros_like(input_ids)
    for b, (length, new) in enumerate(zip(lengths, news)):
        mask[b, :length] = 1
        mask[b, width:width + len(new)] = 1
        input_ids[b, :len(new)] = torch.tensor(new)
        positions[b] = length + torch.arange(fresh)
    layers = []
    for index in range(len(pasts[0])):  # each past left-aligned, its padding masked
        first = pasts[0][index][0]  # (kv heads, length, head dim)
        keys = first.new_zeros((len(pasts), first.shape[0], width, first.shape[-1]))
        values = torch.zeros_like(keys)
        for b, past in enumerate(pasts):
            keys[b, :, :lengths[b]], values[b, :, :lengths[b]] = past[index]
        layers.append((keys, values))
    computed = DynamicCache(layers, config=model.config)
    model.get_decoder()(input_ids=input_ids, attention_mask=mask, position_ids=positions,
                        past_key_values=computed, use_cache=True)
    return [[(torch.cat([layer.keys[b, :, :length], layer.keys[b, :, width:width + len(new)]], 1),
              torch.cat([layer.values[b, :, :length], layer.values[b, :, width:width + len(new)]], 1))
             for layer in computed.layers] for b, (length, new) in enumerate(zip(lengths, news))]


class KeptCache:
    """The keys and values of sequences sampled earlier (a prompt and its reply), kept across
    generation calls so that the next turn of an episode (`prompt.full_history`: the last prompt,
    the reply, a new user turn) prefills only what is new. Least recently used sequences leave
    past `budget_mib`, so ended episodes go first; all leave when the model's weights change
    (read from the parameters' in-place version counters, so an update that shares the module
    cannot be missed). Sequences are found by their first `LEAD` tokens."""

    LEAD = 32

    def __init__(self, model, budget_mib: float):
        self.model, self.budget = model, budget_mib * 2**20
        self.entries: OrderedDict[tuple[int, ...], tuple[torch.Tensor, list[tuple], int]] = OrderedDict()
        """tokens -> (the tokens as a tensor, keys and values per layer, their bytes)"""
        self.leads: dict[tuple[int, ...], set[tuple[int, ...]]] = {}
        self.bytes, self.version = 0, None
        self.superseded: list[tuple[int, ...]] = []
        """Kept sequences the last call's prompts extend whole (dropped once their replies are kept)."""
        self.reused = self.computed = 0
        """Prefix tokens read from kept sequences, and computed, since the start (a measure)."""

    def check_weights(self) -> None:
        """Forget everything if the weights changed since the last call."""
        version = [p._version for p in self.model.parameters()]
        if version != self.version:
            self.clear()
            self.version = version

    def clear(self) -> None:
        self.entries.clear()
        self.leads.clear()
        self.bytes = 0

    def longest(self, tokens: list[int]) -> tuple[int, tuple | None]:
        """The kept sequence sharing the longest leading part with `tokens`, and that length."""
        best, found = 0, None
        query = torch.tensor(tokens)
        for key in self.leads.get(tuple(tokens[:self.LEAD]), ()):
            kept = self.entries[key][0]
            n = min(len(kept), len(query))
            differ = (kept[:n] != query[:n]).nonzero()
            common = int(differ[0]) if len(differ) else n
            if common > best:
                best, found = common, key
        return best, found

    def take(self, key: tuple, length: int) -> list[tuple]:
        """The first `length` tokens' keys and values of kept sequence `key` (now the most recent)."""
        self.entries.move_to_end(key)
        return [(k[:, :length], v[:, :length]) for k, v in self.entries[key][1]]

    def put(self, tokens: list[int], states: list[tuple]) -> None:
        key = tuple(tokens)
        size = sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in states)
        if len(key) < self.LEAD or size > self.budget:
            return
        self.drop(key)
        self.entries[key] = (torch.tensor(tokens), states, size)
        self.leads.setdefault(key[:self.LEAD], set()).add(key)
        self.bytes += size
        while self.bytes > self.budget:
            self.drop(next(iter(self.entries)))

    def drop(self, key: tuple) -> None:
        if key in self.entries:
            self.bytes -= self.entries.pop(key)[2]
            self.leads[key[:self.LEAD]].discard(key)


def prefix_states(model, prefixes: list[list[int]], pack: Packing, pad_id: int, kept: KeptCache | None
                  ) -> list[list[tuple]]:
    """Each prefix's keys and values per layer: from a kept sequence where one holds at least half
    of it (the rest computed reading it), else prefilled as prefix trees."""
    states: list = [None] * len(prefixes)
    reuse = {}
    if kept is not None:
        kept.check_weights()
        kept.superseded = []
        for j, prefix in enumerate(prefixes):
            length, key = kept.longest(prefix)
            length = min(length, len(prefix) - 1)  # at least one token computed
            if key is not None and 2 * length >= len(prefix):
                reuse[j] = (key, length)
    if reuse:
        kept.superseded = [key for key, length in reuse.values() if length == len(key)]
        found = extend(model, [kept.take(key, length) for key, length in reuse.values()],
                       [prefixes[j][length:] for j, (_, length) in reuse.items()])
        for j, state in zip(reuse, found):
            states[j] = state
        kept.reused += sum(length for _, length in reuse.values())
    rest = [j for j in range(len(prefixes)) if states[j] is None]
    if rest:
        for j, state in zip(rest, tree_prefill(model, [prefixes[j] for j in rest], pack, pad_id)):
            states[j] = state
    if kept is not None:
        kept.computed += sum(len(p) for p in prefixes) - sum(length for _, length in reuse.values())
    return states


class PrefixCache:
    """Each distinct prompt prefix's keys and values, once, and which samples read them."""

    def __init__(self, model, states: list[list[tuple]], owner: list[int]):
        """`states`: each distinct prefix's keys and values per layer (`prefix_states`);
        `owner[i]`: sample i's prefix."""
        device = model_device(model)
        lengths = [state[0][0].shape[1] for state in states]
        width = max(lengths)
        # Groups: at most `per` samples of one prefix, padded with a sample index past the last.
        groups_per_head = model.config.num_attention_heads // model.config.num_key_value_heads
        per = max(1, QUERIES // groups_per_head)
        members: list[list[int]] = [[] for _ in states]
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
        lengths = torch.tensor(lengths)[group_prefix]
        self.bias = torch.zeros((len(slots), 1, 1, width), device=device)  # (groups, 1, 1, width)
        self.bias.masked_fill_((torch.arange(width) >= lengths[:, None])[:, None, None].to(device), float("-inf"))
        self.keys, self.values = [], []  # per layer (groups, kv, width, d), each prefix left-aligned
        for layer in range(len(states[0])):
            for kind, out in ((0, self.keys), (1, self.values)):
                first = states[0][layer][kind]
                stacked = first.new_zeros((len(states), first.shape[0], width, first.shape[-1]))
                for j, state in enumerate(states):
                    stacked[j, :, :state[layer][kind].shape[1]] = state[layer][kind]
                out.append(stacked[group_prefix.to(device)])

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
def generate(model, prompts: list[list[int]], params, eos_id: int, pad_id: int, pack: Packing,
             kept: KeptCache | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Sampled tokens (prompts, steps) and their log-probs under `params.temperature`, every row
    run to the step the last one finished (later tokens `pad_id`). Prompts need two tokens or more.
    With `kept`: prefixes read what it holds of them, and each prompt with its reply is kept."""
    distinct = {}
    owner = [distinct.setdefault(tuple(p[:-1]), len(distinct)) for p in prompts]
    states = prefix_states(model, [list(p) for p in distinct], pack, pad_id, kept)
    cache = PrefixCache(model, states, owner)
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
    sampled = torch.stack(sampled, 1)
    if kept is not None:  # computed: the prompt's last token and the reply but its last token
        for key in kept.superseded:  # wholly the start of a prompt just answered
            kept.drop(key)
        for row, prompt in enumerate(prompts):
            reply = sampled[row].tolist()
            n = reply.index(eos_id) + 1 if eos_id in reply else len(reply)
            kept.put(prompt + reply[:n - 1], [
                (torch.cat([k, own_keys[i][row, :, :n]], 1), torch.cat([v, own_values[i][row, :, :n]], 1))
                for i, (k, v) in enumerate(states[owner[row]])])
    return sampled, torch.stack(logprobs, 1)
