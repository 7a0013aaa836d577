"""`agentrl plan`: the memory one GPU needs for a recipe's SFT and RL phases, part by part, so a
backend is chosen before a job fails at its first step.

The arithmetic follows what agentrl's backends hold (P parameters, T of them trained; N ranks):
- single: the weights in the model's dtype, with fp32 master copies when that is bf16; fp32
  gradients and AdamW moments.
- fsdp2: everything sharded over N; with mixed precision (on GPUs) the sharded master weights,
  gradients and moments are fp32, and bf16 copies of the root (embeddings, head) and of two
  decoder layers (the one computing and the one prefetched) are gathered.
- zero2: a full bf16 copy of the weights on every rank, fp32 master weights, gradients and
  moments partitioned; zero3: the bf16 weights partitioned too (two layers gathered).
- cpu_offload moves the optimiser state (and with fsdp2 / zero3 the weights) to CPU memory.
- RL adds the reference model (kl_coef > 0, without LoRA), the PPO critic, and the sampler: the
  HF sampler shares the single actor's weights but holds a full copy beside a sharded one, plus
  its KV cache for the rank's episodes (and the kept cache across turns, `keep_cache_mib`, up to
  every live episode's sequence at `--context` tokens) and its largest prefill forward's working
  memory (the shared decoder's forwards hold at most `PREFILL_TOKENS` padded tokens; `generate`,
  with `share_prefixes` false or a model family the shared decoder does not run, prefills every
  episode's prompt at once); vLLM takes `gpu_memory_utilization` of the GPU (or its
  weights plus `kv_cache_gib`).
- Activations of one micro-batch (`micro_batch_tokens`): ACT_H x hidden + ACT_I x intermediate
  values per token and layer (Qwen2 / Llama layers in eager PyTorch with SDPA, counted from what
  autograd saves and fitted to measured peaks); with activation checkpointing, one hidden state
  per layer plus CHECKPOINT_LAYERS layers' full sets; and the fused log-prob's working memory.
- The estimate is of live tensors (what `torch.cuda.max_memory_allocated` reports; the caching
  allocator's spare blocks come on top), as a sum of parts: every gradient beside the whole
  micro-batch's activations, which backward never holds at once, so it is on the safe side.
  Measured against it on CPU (fp32, live peaks, benchmarks/memory_plan.py, tests/test_plan.py):
  SFT steps of 35M-parameter models at 4,096 and 8,192-token micro-batches, 0.91-0.96 without
  checkpointing (single and fsdp2) and 0.80-1.00 with it, over MLP widths of 1 to 9 x hidden.
  bf16 on GPUs (norms upcast to fp32 inside) is not yet measured: the benchmark's GPU line is
  the check.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from agentrl.config import Config, ConfigError
from agentrl.kernels.linear_logprob import BACKWARD_CHUNK_BYTES, CHUNK_ROWS
from agentrl.sampler import keep_cache_mib
from agentrl.sampler.shared_decode import PREFILL_TOKENS, runs_family

GIB = 2 ** 30
ACT_H, ACT_I = 14, 4
"""Values autograd keeps per token and decoder layer: 4 x intermediate (gate, up, SiLU,
product) and about 14 x hidden (norms, q/k/v, rotary, attention output, residual inputs; fitted
to measured CPU peaks, benchmarks/memory_plan.py)."""
CHECKPOINT_LAYERS = 1
"""With activation checkpointing, the layer being recomputed: one layer's full activations (its
backward's temporaries are covered by the layers' gradients, which the sum counts beside it; the
live peak of a small model comes in the head's backward, before those gradients exist)."""
TORCH_HEAD_COPIES = 5
"""Chunk-sized fp32 (rows x vocabulary) tensors the PyTorch log-prob path holds at its peak
(logits, log-softmax, probabilities, their products and gradient; measured)."""
PREFILL_ATTENTION_H, PREFILL_MLP_H, PREFILL_MLP_I = 5, 2, 3
"""Values per token that one decoder layer's forward without autograd holds at its peak: in
attention (hidden states, q, and k / v repeated to every query head) beside the tree mask as an
additive bias, or in the MLP (gate, up, their product); fitted to the shared decoder's prefill on
CPU (`benchmarks/prefill_memory.py`: within 3% for rows of 512 to 8,192 tokens and MLP widths
of 1 to 9 x hidden)."""
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}

KNOWN_MODELS = {
    # config.json values of the hub models the recipes name, to plan without downloading them.
    "Qwen/Qwen2.5-0.5B-Instruct": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                                       num_attention_heads=14, num_key_value_heads=2, vocab_size=151936,
                                       tie_word_embeddings=True),
    "Qwen/Qwen2.5-1.5B-Instruct": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                                       num_attention_heads=12, num_key_value_heads=2, vocab_size=151936,
                                       tie_word_embeddings=True),
    "Qwen/Qwen2.5-3B-Instruct": dict(hidden_size=2048, intermediate_size=11008, num_hidden_layers=36,
                                     num_attention_heads=16, num_key_value_heads=2, vocab_size=151936,
                                     tie_word_embeddings=True),
    "Qwen/Qwen2.5-7B-Instruct": dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                                     num_attention_heads=28, num_key_value_heads=4, vocab_size=152064,
                                     tie_word_embeddings=False),
}


@dataclass
class Architecture:
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    vocab: int
    tied: bool
    shared_decoder: bool = True
    """Whether the HF sampler's shared decoder runs this family (otherwise `generate` does)."""

    @classmethod
    def from_config(cls, cfg: dict) -> Architecture:
        return cls(cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"], cfg["num_attention_heads"],
                   cfg.get("num_key_value_heads") or cfg["num_attention_heads"], cfg["vocab_size"],
                   bool(cfg.get("tie_word_embeddings", False)), runs_family(cfg))

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * (self.hidden // self.heads)

    @property
    def layer_params(self) -> int:
        h, kv = self.hidden, self.kv_dim
        attention = 2 * h * h + 2 * h * kv + h + 2 * kv  # q, o; k, v; the q/k/v biases (Qwen2)
        return attention + 3 * h * self.intermediate + 2 * h  # gate, up, down; two norms

    @property
    def root_params(self) -> int:
        """Embeddings, final norm and an untied head: FSDP's root unit."""
        return self.vocab * self.hidden * (1 if self.tied else 2) + self.hidden

    @property
    def params(self) -> int:
        return self.layers * self.layer_params + self.root_params

    def lora_params(self, lora) -> int:
        h, i, kv = self.hidden, self.intermediate, self.kv_dim
        shapes = {"q_proj": (h, h), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (h, h),
                  "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h)}
        return self.layers * sum(lora.r * sum(shapes[m]) for m in lora.target_modules if m in shapes)


def architecture(config: Config) -> Architecture:
    """The recipe's model shape: its init section, a local folder's (or the HF cache's)
    config.json, or a known hub model's."""
    if config.init is not None:
        tiny = config.init
        return Architecture(tiny.hidden_size, tiny.intermediate_size, tiny.layers, tiny.hidden_size // 64,
                            min(tiny.kv_heads, tiny.hidden_size // 64), tiny.vocab_size, True)
    path = config.model.path
    if path is None:
        raise ConfigError("model.path: the plan needs the model's shape (a folder with config.json, or a hub id)")
    local = Path(path).expanduser() / "config.json"
    if local.is_file():
        return Architecture.from_config(json.loads(local.read_text()))
    from huggingface_hub import try_to_load_from_cache
    cached = try_to_load_from_cache(path, "config.json")
    if isinstance(cached, str):
        return Architecture.from_config(json.loads(Path(cached).read_text()))
    known = KNOWN_MODELS.get(path) or KNOWN_MODELS.get(path + "-Instruct")
    if known is None:
        raise ConfigError(f"model.path: {path} is not a local folder, not in the Hugging Face cache and not one of "
                          f"{', '.join(KNOWN_MODELS)}: the plan cannot know its shape")
    return Architecture.from_config({"model_type": "qwen2", **known})


def actor_parts(arch: Architecture, actor, optim_offload: bool, dtype_bytes: int, gpus: int, cuda: bool
                ) -> dict[str, float]:
    """Bytes per GPU of the trained model: weights, gradients, optimiser state."""
    lora = getattr(actor, "lora", None)
    P = arch.params
    T = arch.lora_params(lora) if lora is not None else P
    frozen = P if lora is not None else 0  # LoRA: the base weights, not trained
    mixed = actor.backend != "single" and getattr(actor, "mixed_precision", False) and cuda
    compute = 2 if mixed else dtype_bytes
    working = (2 * arch.layer_params + arch.root_params) * compute  # gathered for computing
    if actor.backend == "single":  # fp32 master copies of low-precision trained weights
        master = T * 4 if dtype_bytes < 4 else 0
        return {"weights": (frozen + T) * dtype_bytes + master if lora else P * dtype_bytes + master,
                "gradients": T * 4, "optimizer": 2 * T * 4}
    master = 4 if mixed else dtype_bytes
    if actor.backend == "fsdp2":
        on_gpu = 0 if optim_offload else 1
        return {"weights": on_gpu * (frozen + T) * master / gpus + working if lora else
                on_gpu * P * master / gpus + working,
                "gradients": on_gpu * T * master / gpus, "optimizer": on_gpu * 2 * T * master / gpus}
    # DeepSpeed: compute copy (zero2 whole, zero3 partitioned) + fp32 master partitions (bf16 only)
    weights = P * compute if actor.backend == "zero2" else P * compute / gpus + working
    master_copy = 0 if optim_offload or not mixed else T * 4 / gpus
    return {"weights": weights + master_copy, "gradients": T * compute / gpus,
            "optimizer": 0 if optim_offload else 2 * T * 4 / gpus}


def activations(arch: Architecture, tokens: int, checkpointing: bool, compute_bytes: int) -> float:
    """What the decoder layers keep for backward over one micro-batch of `tokens`."""
    full_layer = tokens * (ACT_H * arch.hidden + ACT_I * arch.intermediate) * compute_bytes
    if checkpointing:
        return arch.layers * tokens * arch.hidden * compute_bytes + CHECKPOINT_LAYERS * full_layer
    return arch.layers * full_layer


def head_memory(arch: Architecture, tokens: int, cuda: bool) -> float:
    """The fused log-prob's working memory: on GPUs (Triton) one backward chunk of logits; on CPU
    (the chunked PyTorch path) a few fp32 copies of up to CHUNK_ROWS rows of logits."""
    if cuda:
        return BACKWARD_CHUNK_BYTES
    return TORCH_HEAD_COPIES * min(tokens, CHUNK_ROWS) * arch.vocab * 4


def phase_plan(config: Config, phase: str, gpus: int, cuda: bool = True, context: int = 2048) -> dict[str, float]:
    """Bytes per GPU of each part of `phase` ("sft" or "rl"). `cuda`: as on GPUs (mixed
    precision where the backend uses it), else as on CPU. `context`: prompt + response tokens of
    one sequence, for the sampler's KV cache."""
    arch = architecture(config)
    section = config.sft if phase == "sft" else config.rl
    actor = section.actor
    b = DTYPE_BYTES[config.model.dtype]
    offload = getattr(actor, "cpu_offload", False)
    parts = actor_parts(arch, actor, offload, b, gpus, cuda)
    mixed = actor.backend != "single" and getattr(actor, "mixed_precision", False) and cuda
    parts["activations"] = activations(arch, section.micro_batch_tokens, actor.activation_checkpointing,
                                       2 if mixed else b)
    parts["log-prob head"] = head_memory(arch, section.micro_batch_tokens, cuda)
    if phase == "rl":
        rl = config.rl
        lora = getattr(actor, "lora", None)
        if rl.kl_coef > 0 and lora is None:
            parts["reference"] = arch.params * b
        if rl.advantage.type == "ppo":
            parts["critic"] = 4 * arch.params * b  # weights, gradients, two moments
        episodes = rl.tasks_per_step * rl.group_size // gpus
        if rl.sampler.type == "vllm":
            if rl.sampler.kv_cache_gib is not None:
                parts["sampler"] = arch.params * b + rl.sampler.kv_cache_gib * GIB
            else:
                parts["sampler_share"] = rl.sampler.gpu_memory_utilization  # of the GPU: resolved by the caller
        else:
            copy = arch.params * b if actor.backend != "single" else 0
            parts["sampler"] = copy + episodes * episode_bytes(arch, context, b)
            bound = PREFILL_TOKENS if rl.sampler.share_prefixes and arch.shared_decoder else None
            parts["sampler prefill"] = prefill_bytes(arch, episodes, context, b, bound)
            kept = keep_cache_mib(config) * 2**20
            if kept:  # each live episode's sequence, kept between turns up to the budget
                parts["kept cache"] = min(kept, episodes * episode_bytes(arch, context, b))
    return parts


def prefill_bytes(arch: Architecture, episodes: int, context: int, b: int, bound: int | None) -> int:
    """The working memory of the sampler's largest prefill forward: `episodes` prompts of
    `context` tokens with nothing in common, in rows of that length, as many as `bound` padded
    tokens hold (the shared decoder's `PREFILL_TOKENS`; None: `generate`, all at once). The
    forward's keys and values of every layer (each prompt's copy of its own is the sampler's
    cache), the rows' tree mask, and the larger of a layer's attention and MLP peaks."""
    rows = max(1, min(episodes, bound // context)) if bound else episodes
    tokens, pairs = rows * context, rows * context ** 2
    attention = (pairs + tokens * PREFILL_ATTENTION_H * arch.hidden) * b
    mlp = tokens * (PREFILL_MLP_H * arch.hidden + PREFILL_MLP_I * arch.intermediate) * b
    return tokens * arch.layers * 2 * arch.kv_dim * b + pairs + max(attention, mlp)


def episode_bytes(arch: Architecture, context: int, b: int) -> int:
    """One live episode's keys and values at `context` tokens."""
    return context * arch.layers * 2 * arch.kv_dim * b


def memory_plan(config: Config, gpus: int, gpu_memory_gib: float, cuda: bool = True, context: int = 2048
                ) -> dict[str, dict]:
    """{phase: {parts (GiB per GPU), total_gib, fits}} for the recipe's SFT and RL phases."""
    plan = {}
    for phase in ("sft", "rl"):
        if getattr(config, phase) is None:
            continue
        parts = phase_plan(config, phase, gpus, cuda, context)
        share = parts.pop("sampler_share", None)
        gib = {name: value / GIB for name, value in parts.items()}
        if share is not None:
            gib["sampler"] = share * gpu_memory_gib
        total = sum(gib.values())
        plan[phase] = {"backend": getattr(config, phase).actor.backend, "parts_gib": gib, "total_gib": total,
                       "fits": total <= gpu_memory_gib}
    if "rl" in plan:
        plan["rl"].update(context=context, episode_mib=episode_bytes(
            architecture(config), context, DTYPE_BYTES[config.model.dtype]) / 2**20)
    return plan


def print_plan(plan: dict, gpus: int, gpu_memory_gib: float, params: int) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"Memory per GPU (GiB), {gpus} GPU(s) of {gpu_memory_gib:g} GiB, "
                        f"{params / 1e9:.2f}B parameters")
    table.add_column("part")
    for phase, entry in plan.items():
        table.add_column(f"{phase} ({entry['backend']})", justify="right")
    names = list(dict.fromkeys(name for entry in plan.values() for name in entry["parts_gib"]))
    for name in names:
        table.add_row(name, *(f"{e['parts_gib'][name]:.1f}" if name in e["parts_gib"] else "-" for e in plan.values()))
    table.add_row("total", *(f"{e['total_gib']:.1f}" for e in plan.values()))
    table.add_row("fits", *("yes" if e["fits"] else "NO" for e in plan.values()))
    Console().print(table)
    if "rl" in plan:
        print(f"one live episode's keys and values at {plan['rl']['context']} tokens (--context): "
              f"{plan['rl']['episode_mib']:.1f} MiB")
