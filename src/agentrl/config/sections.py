"""The sections every recipe shares: model, tiny-model init, prompt, sampling, optimiser, SFT,
evaluation; and `Section`, the base of every config class (built-in or a plugin's)."""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from agentrl.prompting import DEFAULT_TEMPLATE, DEFAULT_TURN_TEMPLATE, TEMPLATE_FIELDS
from agentrl.registry import ACTORS


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _parent_read_as_set(cls, data):
        """A section of the parent class built in Python (an `OptimConfig` for SFT's optimiser, a
        `SamplingConfig` for evaluation's or GCD's judgments) is read as the fields it set, as a
        recipe's mapping is: this section's own defaults fill the rest."""
        if isinstance(data, Section) and type(data) is not cls and issubclass(cls, type(data)):
            return data.model_dump(exclude_unset=True)
        return data


class ModelConfig(Section):
    path: str | None = None
    """A Hugging Face causal LM: a local folder or a hub id. None with an `init` section: the
    tiny model is created at <run_dir>/model-init."""
    dtype: Literal["float32", "bfloat16"] = "float32"
    """Parameter dtype of the actor and the sampler. bfloat16 on a CPU is fast only with bf16
    instructions (AVX-512 / AMX); on an AVX2 CPU it runs many times slower than float32, and the
    model commands say so in one line."""


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
    context_length: int = Field(4096, ge=64)
    """Longest sequence the model takes (`max_position_embeddings`): with `prompt.full_history` an
    episode is one sequence, and one that outgrows it ends there (a 30-step ALFWorld episode is
    about 6k tokens in its own tokenizer)."""
    corpus_episodes: int = Field(300, ge=10)
    """Expert episodes whose prompts and responses train the tokenizer."""
    corpus: str | None = None
    """A JSONL chat dataset (the SFT data's format, e.g. expert data made once) whose messages
    train the tokenizer instead of playing `corpus_episodes` expert episodes."""


class PromptConfig(Section):
    reward_only: ClassVar[tuple[str, ...]] = ("invalid_penalty",)
    """Fields that change only the reward, not the expert's episodes (`pipeline.text_settings`)."""
    template: str = DEFAULT_TEMPLATE
    """Per-step prompt; placeholders {task} {step} {history} {observation} {actions} {memory}
    (the environment's record of the episode, where it keeps one: `env.memory` of ALFWorld and
    ScienceWorld)."""
    history_length: int = Field(2, ge=0)
    """How many past (observation, action) pairs the prompt shows, through `{history}` (a template
    without it is refused unless this is 0)."""
    full_history: bool = False
    """The whole episode as one growing chat, token in, token out: the first prompt is `template`
    (history "(none)"), each later one the previous prompt, the tokens sampled for its response and
    a user turn of `turn_template`, so a step's prompt holds every earlier turn exactly as it was
    sampled and one episode's steps share their leading tokens (with `rl.pack_prefixes`, an
    episode's update computes its turns once). A model whose chat template renders an earlier reply
    otherwise once a turn follows it (Qwen3's and DeepSeek-R1's drop its reasoning) is refused. False:
    each step's prompt is `template` alone, with the last `history_length` steps."""
    turn_template: str = DEFAULT_TURN_TEMPLATE
    """With `full_history`: a user turn after the first; placeholders as `template`'s."""
    require_think: bool = True
    """A response without a reasoning block before the action is invalid (<think>...</think>, or
    one of RLVMR's <planning> <explore> <reflection> <monitor>)."""
    expert_tags: Literal["think", "meta"] = "think"
    """Reasoning tag of the expert's responses in SFT data: `think`, or RLVMR's meta tags
    (planning on the first step, explore when going somewhere not yet visited, monitor
    otherwise), which the `rlvmr` estimator rewards."""
    invalid_penalty: float = Field(0.1, ge=0)
    """Subtracted from the reward of a step whose response had no parseable action."""

    @field_validator("template", "turn_template")
    @classmethod
    def _known_fields(cls, template: str) -> str:
        try:
            template.format(**{f: "" for f in TEMPLATE_FIELDS})
        except (KeyError, IndexError, ValueError) as err:
            raise ValueError(f"template placeholders must be among {TEMPLATE_FIELDS}: {err!r}") from None
        return template

    @model_validator(mode="after")
    def _history_shown(self):
        """A window the template never shows would be a silent no-op: refused."""
        if self.history_length and not self.full_history and "{history}" not in self.template:
            raise ValueError(f"history_length is {self.history_length} but template has no {{history}} placeholder, "
                             f"so no earlier step would be shown: set history_length: 0 or add {{history}}")
        return self


class SamplingConfig(Section):
    temperature: float = Field(1.0, ge=0)
    """0 means greedy."""
    top_p: float = Field(1.0, gt=0, le=1)
    """Nucleus sampling mass (1: off)."""
    max_new_tokens: int = Field(48, ge=1)
    """Longest response per step (the end-of-turn token included)."""
    retries: int = Field(0, ge=0)
    """Sample a step's response again, up to this many times, while the action it names is not
    among the environment's admissible actions, and, in an environment whose engine judges moves
    itself (`try_step`: ScienceWorld's parser), while the engine rejects it (a rejected move
    changes nothing and costs no step); the first move taken is played, else the last. An
    environment that lists no actions and judges none is never retried. A policy that repeats a no-op
    in a state its no-op leaves unchanged is stuck until the step limit; BUTLER's evaluation
    played its next beam the same way. Retries sample as the first try does (at temperature 0
    they repeat it); in RL rollouts only the played sample is trained on."""


class PlaySamplingConfig(SamplingConfig):
    """Sampling where a policy is played rather than trained (evaluation, DAgger's rounds)."""

    temperature: float = Field(0.4, ge=0)
    """0 means greedy (default 0.4, also when another field is set)."""


class RoundSamplingConfig(PlaySamplingConfig):
    """How DAgger's rounds sample the policy's moves."""

    retries: Literal[0] = 0
    """None: the expert labels the states an inadmissible move leads to, so that move is played."""


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


class SFTOptimConfig(OptimConfig):
    """The SFT phase's optimiser."""

    lr: float = Field(1e-5, gt=0)
    """Learning rate (constant after warmup; default 1e-5, also when another field is set)."""


class DaggerConfig(Section):
    """DAgger after SFT (`agentrl.dagger`): rounds of the policy playing train episodes, the
    environment's expert labelling every state it reached, and SFT on the aggregate."""

    rounds: int = Field(3, ge=1)
    """Rounds of play, label, train."""
    episodes: int = Field(200, ge=1)
    """Train episodes the policy plays per round."""
    sampling: RoundSamplingConfig = RoundSamplingConfig()
    """How the policy samples its moves in the rounds."""
    expert_share: tuple[Annotated[float, Field(ge=0, le=1)], Annotated[float, Field(ge=0, le=1)]] = (0.5, 0.0)
    """Share of executed moves that are the expert's, in the first and the last round (linear in
    between; the policy's own move otherwise)."""
    epochs: int = Field(1, ge=1)
    """SFT passes over the aggregate (expert data and every round's labels so far) per round."""


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
    """Examples are packed as prefix trees, each leading part their prompts share computed once
    (see `rl.pack_prefixes`). Off by default: expert data rarely repeats a prompt, and a packed SFT
    (another float summation order) gives a slightly different cold start than the results so far."""
    optim: SFTOptimConfig = SFTOptimConfig()
    """Optimiser of the SFT phase (default lr 1e-5)."""
    actor: Annotated[Section, ACTORS.field("single")] | None = None
    """The actor backend, by `backend` (single, fsdp2, zero2, zero3; LoRA with any), as in RL.
    None: RL's (`rl.actor`), or single without an RL phase. With LoRA the SFT output is the
    merged model."""
    dagger: DaggerConfig | None = None
    """DAgger rounds after SFT on the expert data (None: behaviour cloning only); each round's
    data and model are kept in <run_dir>/sft/dagger and reused when rerun with the same settings."""
    save_every: int = Field(0, ge=0)
    """Checkpoint every N optimiser steps (0: at the end of each epoch). A stopped SFT resumes
    from its last checkpoint when rerun with the same settings; the checkpoints are removed once
    the model is written."""


class EvalConfig(Section):
    splits: list[Literal["l0", "l1", "l2"]] = ["l0", "l1", "l2"]
    """Evaluation splits: l0 in-domain, l1 unseen, l2 out-of-domain."""
    episodes: int = Field(100, ge=1)
    """Episodes per split (the first N tasks of the split)."""
    batch_size: int | None = Field(None, ge=1)
    """Episodes played at once, each in its own environment (None: a split's episodes all at once).
    Bounds the environments alive: a ScienceWorld one is a JVM of about 200 MB."""
    sampling: PlaySamplingConfig = PlaySamplingConfig()
    """Sampling at evaluation."""
    max_aborted_share: float = Field(0.5, ge=0, le=1)
    """A split on which more than this share of the episodes aborted (or none finished) is an
    error, never a result."""
    initial: bool = True
    """Evaluate the starting model before SFT (false skips it: a random-init model scores 0, and on
    a real engine every one of its episodes runs to the step limit)."""
