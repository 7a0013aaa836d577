"""Run configuration: pydantic models loaded from YAML recipes.

Every model forbids unknown keys and documents each field. A variant section (environment,
advantage estimator, policy loss, auxiliary loss, sampler, actor backend) is validated by the
config class registered under its `type` (`agentrl.registry`), so plugins enter through recipes
like built-ins. `load_config` turns any validation error into a `ConfigError` that names the
offending field and the recipe file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from agentrl.prompting import DEFAULT_TEMPLATE, TEMPLATE_FIELDS
from agentrl.registry import (
    ACTORS,
    ADVANTAGES,
    AUX_LOSSES,
    COMPONENTS,
    ENVIRONMENTS,
    KL_ESTIMATORS,
    POLICY_LOSSES,
    SAMPLERS,
)


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, allow_inf_nan=False)




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


class NTHRConfig(Section):
    """NTHR: scale by `eta` the advantage of negative-sample tokens whose last-layer gradient
    coupling to the group's positive tokens exceeds `tau` x the positives' own mean coupling
    (exact definition: agentrl/advantages/nthr.py)."""

    tau: float = 1.0
    """Coupling threshold, relative to the positive tokens' own mean coupling."""
    eta: float = Field(0.5, ge=0, le=1)
    """Multiplier of the advantage of negative tokens above the threshold."""


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
    advantage: Annotated[Section, ADVANTAGES.field("grpo")] = Field(default_factory=lambda: ADVANTAGES.make("grpo"))
    """The advantage estimator, by `type` (grpo, rloo, gigpo, gagpo, rlvmr, ppo, or a plugin's)."""
    loss: Annotated[Section, POLICY_LOSSES.field("ppo_clip")] = Field(default_factory=lambda: POLICY_LOSSES.make("ppo_clip"))
    """The policy loss, by `type` (ppo_clip, seq_ratio, or a plugin's)."""
    optim: OptimConfig = Field(default_factory=OptimConfig)
    """Optimiser of the actor."""
    actor: Annotated[Section, ACTORS.field("single")] = Field(default_factory=lambda: ACTORS.make("single"))
    """The actor backend, by `backend` (single, fsdp2, zero2, zero3)."""
    sampler: Annotated[Section, SAMPLERS.field("hf")] = Field(default_factory=lambda: SAMPLERS.make("hf"))
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
    initial: bool = True
    """Evaluate the starting model before SFT (false skips it: a random-init model scores 0, and on
    a real engine every one of its episodes runs to the step limit)."""


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
    env: Annotated[Section, ENVIRONMENTS.field("household")] = Field(default_factory=lambda: ENVIRONMENTS.make("household"))
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
            self.sft.actor = self.rl.actor.model_copy(deep=True) if self.rl is not None else ACTORS.make("single")
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
