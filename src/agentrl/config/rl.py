"""The RL section of a recipe (`rl:`) and its own sub-sections: the environment pool, the
rollout loop. The variant sub-sections (advantage, loss, actor, sampler, aux, components) are
validated by the config class registered under their `type`."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from agentrl.config.sections import OptimConfig, Section
from agentrl.registry import (
    ACTORS,
    ADVANTAGES,
    AUX_LOSSES,
    COMPONENTS,
    KL_ESTIMATORS,
    POLICY_LOSSES,
    SAMPLERS,
)


class RaySectionConfig(Section):
    address: str | None = None
    """The Ray cluster (`ray.init(address=...)`); None: $RAY_ADDRESS, else a local cluster started
    for the run (and stopped after it). One nothing answers at is refused at start (exit 2)."""
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
    aborts only its own episode. Expert episodes (SFT data, the tokenizer's corpus) are played in
    this many processes too (the same examples, where the environment is deterministic: ScienceWorld
    lists objects in an order that varies between JVMs)."""
    step_timeout_s: float = Field(60.0, gt=0)
    """A worker that takes longer than this per environment it steps (it steps its environments
    one after another) is killed and replaced (its episodes aborted)."""
    reset_timeout_s: float = Field(300.0, gt=0)
    """A worker that takes longer than this per environment it resets is killed and replaced."""
    ray: RaySectionConfig = Field(default_factory=RaySectionConfig)
    """Cluster and per-worker resources of the ray backend."""


class FilterGroupsConfig(Section):
    """DAPO's dynamic sampling: a group whose episodes all returned the same carries no
    group-relative advantage (GRPO, RLOO, GAGPO's episode terms), so it is left out of the update
    and more tasks are drawn until the step has `rl.tasks_per_step` groups whose returns differ."""

    max_draws: int = Field(4, ge=1)
    """Rounds of tasks a step may draw (the first is the step's usual draw; each later one sized
    by the share of groups that differed so far). The step trains on what it has after the last."""


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
    filter_groups: FilterGroupsConfig | None = None
    """Train only on groups whose returns differ, drawing more tasks for the others (None: every
    group trains). rollout/* metrics cover every episode drawn; rollout/uniform_groups counts
    those left out, rollout/draws the rounds."""


class SamplerRayConfig(Section):
    address: str | None = None
    """The Ray cluster (`ray.init(address=...)`); None: $RAY_ADDRESS, else a local cluster started
    for the run (and stopped after it). One nothing answers at is refused at start (exit 2)."""
    num_cpus: float = Field(1.0, ge=0)
    """CPUs Ray reserves for the sampler actor (its environment workers are its own processes, or
    Ray actors of their own with `rl.env_pool.backend: ray`)."""
    num_gpus: float = Field(0.0, ge=0)
    """GPUs Ray reserves for the sampler actor (it generates on the first one it is given)."""


class OverlapConfig(Section):
    """The sampler in a process of its own (or a Ray actor), playing the next steps' episodes while
    the trainer updates (`agentrl.rollout.ahead`): step t's samples come from the weights of update t - 1 - k
    or later, pushed after each update. Each sample records the version that sampled it; one older
    than `staleness` updates, or weights that are not the version they claim, stop the run. With
    k >= 1 the samples are off-policy by up to k updates: `rl.old_logprobs: actor` with `rl.tis_cap`
    corrects for it (decoupled PPO), the default ratio against the sampler's log-probs does not.
    On resume the first k steps sample with the checkpoint's weights (the older versions an
    uninterrupted run would have used are not saved)."""

    staleness: int = Field(1, ge=0)
    """k: how many updates behind the sampling weights may be (0: the sampler process plays each
    step after the last update, exactly the samples of the in-process loop)."""
    sampler_threads: int | None = Field(None, ge=1)
    """torch threads of the sampler process (None: the trainer's, so that k = 0 computes what the
    in-process loop does)."""
    trainer_threads: int | None = Field(None, ge=1)
    """torch threads of the trainer process (None: as it is)."""
    sampler_gpu: int | None = Field(None, ge=0)
    """The GPU the sampler process generates on (None: the trainer's own). The weights travel
    through host memory."""
    backend: Literal["process", "ray"] = "process"
    """process: the sampler in a local process; ray: a Ray actor, placed by Ray on any node of the
    cluster with the resources `ray` asks for (`pip install 'agentrl[ray]'`). The same sampler code
    and messages either way; the weights travel through Ray's object store."""
    ray: SamplerRayConfig = Field(default_factory=SamplerRayConfig)
    """Cluster and resources of the ray backend's sampler actor."""

    @model_validator(mode="after")
    def _gpu_by_backend(self):
        if self.backend == "ray" and self.sampler_gpu is not None:
            raise ValueError("rl.overlap.sampler_gpu picks a local GPU for the process backend; with backend: ray "
                             "Ray places the sampler: set rl.overlap.ray.num_gpus")
        return self


class RLConfig(Section):
    steps: int = Field(100, ge=0)
    """Training steps (one rollout batch and one update each)."""
    tasks_per_step: int = Field(16, ge=1)
    """Task groups per training step (a multiple of the number of ranks)."""
    group_size: int = Field(8, ge=1)
    """Rollouts per task; all play the same task instance."""
    balance_task_types: bool = False
    """Draw each task in two stages: a task type of the train pool uniformly, then one of its
    tasks, so that every type is trained on equally often, as the evaluation splits weigh them
    (ScienceWorld's L0 / L1). False: every task of the pool equally likely, so that a type with more
    variations (ScienceWorld's test-conductivity: 45x power-component's) is trained on more."""
    train_task_types: list[str] | Literal["all"] | None = None
    """The task types RL draws from, in place of env.train_task_types (None: the env's; "all":
    every type of the train split), so that RL can train on types the cold start's expert data
    left out (ScienceWorld: those whose gold paths overrun the step limit). The expert data, SFT
    and evaluation keep the env's."""
    mini_batch_size: int = Field(256, ge=1)
    """Step samples per optimiser step."""
    mini_batch_order: Literal["shuffled", "grouped"] = "shuffled"
    """How a step's samples are dealt into mini-batches: shuffled, or grouped (the task groups in
    a random order, each group's samples together, as verl's actor does with `shuffle: false`).
    Grouped keeps a group's shared prompts in one mini-batch, so prefix packing computes them
    once (the demo's update: 28% of its tokens against 34% shuffled)."""
    micro_batch_tokens: int = Field(16384, ge=1)
    """Token budget of one forward/backward (does not change the update)."""
    pack_prefixes: bool = True
    """Step samples are packed as prefix trees, each leading part their prompts share computed
    once (update, sampler check, reference, NTHR, auxiliary losses): the same log-probs and gradients up to
    float summation order (`agentrl.packing`). A sample shares a row only where that is modelled
    cheaper at the model's shape (a longer row's attention against the tokens saved: `Packing`).
    Needs sdpa or eager attention."""
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
    (rollout/logprob_diff_mean, _max, rollout/kl_sampler_actor; 0: never). Measured in the
    update's first optimiser step, whose forward passes run the weights that sampled: no pass of
    its own, over the step's samples when one mini-batch holds them (else the first mini-batch's).
    With old_logprobs: actor, every step in a forward pass of its own, before the update."""
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
    aux: list[Annotated[Section, AUX_LOSSES.field("")]] = []
    """Auxiliary losses added to the policy loss in the same optimiser step."""
    components: list[Annotated[Section, COMPONENTS.field("")]] = []
    """Trainer components by `type` (`agentrl.components`: reward terms, token reweighting,
    measurements), hooked into every step in this order after the KL reference's and the
    estimator's own: built in, `nthr` (NTHR, Deng et al.) and `coupling` (the gradient-coupling
    lab); a plugin's the same way."""
    eval_every: int = Field(0, ge=0)
    """Evaluate every N steps (0: only at the end)."""
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
    overlap: OverlapConfig | None = None
    """Generation and training overlapped: the sampler in its own process (or a Ray actor), up to
    `staleness` updates ahead (None: one after the other in the trainer's process). Needs
    actor.backend: single."""
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
        return _components_moved(data)

    @field_validator("kl_estimator")
    @classmethod
    def _known_kl(cls, name: str) -> str:
        KL_ESTIMATORS.entry(name)
        return name

    @model_validator(mode="after")
    def _filter_groups_needs_groups(self):
        if self.rollout.filter_groups is not None and self.group_size < 2:
            raise ValueError("rl.rollout.filter_groups keeps groups whose returns differ: it needs rl.group_size >= 2")
        return self

    @model_validator(mode="after")
    def _overlap_supports(self):
        if self.overlap is not None and self.actor.backend != "single":
            raise ValueError("rl.overlap runs the sampler beside a single-process actor for now: it needs "
                             "rl.actor.backend: single")
        return self

    @model_validator(mode="after")
    def _tis_needs_actor_logprobs(self):
        if self.tis_cap is not None and self.old_logprobs != "actor":
            raise ValueError("rl.tis_cap weights by p_actor / p_sampler: it needs rl.old_logprobs: actor")
        return self

    @model_validator(mode="after")
    def _backend_supports(self):
        """A section whose config says `one_process_only()` (a reason) runs with actor.backend:
        single only; one that `reads_policy` (a full HF copy of it) not on a sharded actor with
        vLLM, which has no such copy."""
        if self.actor.backend == "single":
            return self
        sections = {"rl.advantage": self.advantage, "rl.loss": self.loss,
                    **{f"rl.aux[{i}]": a for i, a in enumerate(self.aux)},
                    **{f"rl.components[{i}]": c for i, c in enumerate(self.components)}}
        for where, section in sections.items():
            reason = getattr(section, "one_process_only", lambda: None)()
            if reason:
                raise ValueError(f"{where}: {reason} runs in one process only (actor.backend: single)")
        if self.sampler.type == "vllm":
            needs_copy = {f"{where} ({section.type})": getattr(section, "reads_policy", False)
                          for where, section in sections.items()}
            needs_copy["rl.actor.lora with rl.kl_coef"] = getattr(self.actor, "lora", None) is not None and self.kl_coef > 0
            for name, used in needs_copy.items():
                if used:
                    raise ValueError(f"{name} needs actor.backend: single when sampler.type is vllm")
        return self


def _components_moved(data):
    """Recipes and saved configs from before NTHR and the coupling lab became components: `rl.nthr`
    and `rl.coupling_every / _pairs / _lr` read as the components they now are."""
    if not isinstance(data, dict) or not ({"nthr", "coupling_every", "coupling_pairs", "coupling_lr"} & set(data)):
        return data
    data = dict(data)
    moved = []
    if (nthr := data.pop("nthr", None)) is not None:
        moved.append({"type": "nthr", **nthr})
    coupling = {key: data.pop(f"coupling_{key}") for key in ("every", "pairs", "lr") if f"coupling_{key}" in data}
    if coupling.get("every"):
        moved.append({"type": "coupling", **coupling})
    data["components"] = moved + list(data.get("components") or [])
    return data
