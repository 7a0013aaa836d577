"""Samplers, registered by name with their config class (`agentrl.registry.SAMPLERS`, chosen by
`rl.sampler.type`). A sampler builder is `(config, model_path, policy, tokenizer, run) -> Sampler`
(`agentrl.sampler.base.Sampler`): `policy()` gives an HF model with the actor's weights to
generate with (the actor's own module when it is not sharded), `run` the whole run config."""

from __future__ import annotations

from agentrl.config import HFSamplerConfig, VLLMSamplerConfig
from agentrl.registry import SAMPLERS


@SAMPLERS.register("hf", HFSamplerConfig)
def hf(config, model_path, policy, tokenizer, run):
    from agentrl.sampler.hf import HFSampler
    return HFSampler(policy(), tokenizer, config.share_prefill)


@SAMPLERS.register("vllm", VLLMSamplerConfig)
def vllm(config, model_path, policy, tokenizer, run):
    from agentrl.sampler.vllm import VLLMSampler
    return VLLMSampler(model_path, tokenizer, config, run.model.dtype, run.seed, getattr(run.rl.actor, "lora", None))
