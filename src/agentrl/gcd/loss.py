"""The GCD auxiliary loss: a GRPO loss on the actor's judgments of its own actions.

Per training step: label the rollout's steps (rules / environment / external judge), select a
balanced set of (state, action) pairs, sample `group_size` judgments of each from the current
policy, reward 1 when the verdict matches the label (an unparseable verdict is wrong), and turn
the rewards into group-normalised advantages. The trainer adds `weight` x the clipped policy-
gradient loss on the judgment tokens to the RL loss in the same optimiser step.
"""

from __future__ import annotations

import random
import statistics
from pathlib import Path
from typing import Literal

import torch
from pydantic import Field, model_validator
from safetensors.torch import load_file, save_file

from agentrl.advantages.common import normalize
from agentrl.components import Component
from agentrl.config import SamplingConfig, Section
from agentrl.forward import trained_hidden
from agentrl.gcd.correction import PromptCorrection
from agentrl.gcd.judge import ChatEndpoint, ExternalJudge, critique, judge_ids, parse_verdict
from agentrl.gcd.labels import balanced_selection, label_counts, label_steps
from agentrl.losses.aux import AuxBatch
from agentrl.losses.policy import PPOClipConfig, ppo_clip
from agentrl.packing import TokenBatch, TrainSample, collate
from agentrl.prompting import ChatTurns
from agentrl.registry import AUX_LOSSES


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


class JudgmentSamplingConfig(SamplingConfig):
    """How the actor samples its judgments."""

    max_new_tokens: int = Field(96, ge=1)
    """Longest judgment (default 96, also when another field is set). It must hold a whole judgment
    (a critique and the verdict tag: up to 51 tokens with the testbed's 512-token vocabulary); a cut
    one has no verdict and scores as wrong (48, the default until 2026-11-25, cut the testbed's
    revisit critiques)."""
    retries: Literal[0] = 0
    """None: a judgment names no action to retry; one without a verdict scores as wrong."""


class GCDAuxConfig(Section):
    """GCD: the actor judges its own actions; GRPO on the judgments ("Rethinking Reward
    Miscalibration of GRPO in Agentic RL")."""

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
    sampling: JudgmentSamplingConfig = JudgmentSamplingConfig()
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

    def one_process_only(self) -> str | None:
        return "the GCD classifier head" if self.judge == "classifier" else None

    @model_validator(mode="after")
    def _llm_needs_endpoint(self):
        if "llm" in self.labels and self.external is None:
            raise ValueError("label source 'llm' needs an `external` judge endpoint")
        if self.correction and self.judge == "classifier":
            raise ValueError("prompt correction needs the generative judge's critiques (judge: generative)")
        if self.correction and self.correction.summarizer == "endpoint" and self.external is None:
            raise ValueError("correction.summarizer 'endpoint' needs an `external` judge endpoint")
        return self


def select_pairs(judge, trajectories, step: int):
    """The step's balanced (state, action) pairs to judge, and the label metrics."""
    cfg = judge.config
    rng = random.Random(f"{judge.seed}:{judge.name}:{step}")
    if judge.external is not None:
        judge.external.counts = dict.fromkeys(judge.external.counts, 0)  # a step that asks nothing logs zeros
    labelled = label_steps(trajectories, cfg.labels, judge.external, cfg.external.pairs_per_step
                           if cfg.external else 0, rng, full_history=judge.turns is not None)
    fitting = [x for x in labelled if judge.fits(x.step)]
    chosen = balanced_selection(fitting, cfg.pairs_per_step, rng)
    metrics = {**label_counts(labelled), "pairs": float(len(chosen)), "too_long": float(len(labelled) - len(fitting))}
    if judge.external is not None:
        metrics["labels/llm_errors"] = float(judge.external.errors)
        metrics.update({f"labels/llm_{k}": float(v) for k, v in judge.external.counts.items()})
    correction = getattr(judge, "correction", None)
    if correction is not None and correction.config.summarizer == "endpoint":
        metrics["correction_errors"] = float(correction.errors)
    return chosen, metrics


def judgment_reward(verdict: bool | None, label: bool) -> float:
    """1 when the verdict matches the label; a missing or unparseable verdict is wrong."""
    return float(verdict is not None and verdict == label)


def group_advantages(rewards: list[float]) -> list[float]:
    """GRPO within one pair's judgments: (r - mean) / (std + 1e-6) with the population std (the
    group is every judgment of the pair, not a sample of them); 0 for a group that agrees."""
    return normalize(rewards, rewards, "population", 1e-6)


def eval_pairs(judge, trajectories, seed: int):
    """Balanced labelled steps for measuring judge accuracy (rule and environment labels only,
    so evaluation never calls the external judge)."""
    sources = [s for s in judge.config.labels if s != "llm"]
    labelled = [x for x in label_steps(trajectories, sources) if judge.fits(x.step)]
    return balanced_selection(labelled, judge.config.eval_pairs, random.Random(seed))


def fits(tokenizer, step, turns: ChatTurns | None, context: int | None, answer_tokens: int) -> bool:
    """Whether the judge's prompt for `step` and an answer of `answer_tokens` fit in `context`: with
    full history the prompt holds the episode so far, which may fill the context (the episode
    ends only when its own next turn would not fit)."""
    return turns is None or context is None or len(judge_ids(tokenizer, step, turns)) + answer_tokens <= context


class GCDLoss(Component):
    def __init__(self, config, sampler, tokenizer, seed: int, external=None, endpoint=None, run_dir=None,
                 turns: ChatTurns | None = None):
        self.config, self.name, self.weight = config, config.name, config.weight
        self.sampler, self.tokenizer, self.seed, self.turns = sampler, tokenizer, seed, turns
        self.external, self.endpoint = external, endpoint
        self.critiques: list[tuple[str, str]] = []
        """(action, critique) of bad actions the judge rightly called bad (prompt correction)."""
        self.correction = None
        if config.correction is not None:
            log = Path(run_dir or ".") / "correction.jsonl"
            self.correction = PromptCorrection(config.correction, self, sampler, tokenizer, endpoint, log)

    def hint(self, step: int) -> str:
        return self.correction.refresh(step) if self.correction else ""

    def fits(self, step) -> bool:
        return fits(self.tokenizer, step, self.turns, getattr(self.sampler, "context_length", None),
                    self.config.sampling.max_new_tokens)

    def state(self) -> dict:
        return {"critiques": self.critiques, "hint": self.correction.hint if self.correction else ""}

    def load_state(self, state: dict) -> None:
        self.critiques = [tuple(c) for c in state.get("critiques", [])]
        if self.correction is not None:
            self.correction.hint = state.get("hint", "")

    def prepare(self, trajectories, step: int) -> AuxBatch:
        cfg = self.config
        chosen, metrics = select_pairs(self, trajectories, step)
        if not chosen:
            return AuxBatch([], metrics)

        prompts = [judge_ids(self.tokenizer, x.step, self.turns) for x in chosen]
        repeated = [p for p in prompts for _ in range(cfg.group_size)]
        generations = self.sampler.generate(repeated, cfg.sampling)
        samples, correct, parsed = [], [], []
        for i, x in enumerate(chosen):
            group = generations[i * cfg.group_size:(i + 1) * cfg.group_size]
            texts = [self.tokenizer.decode(g.token_ids, skip_special_tokens=True) for g in group]
            verdicts = [parse_verdict(t) for t in texts]
            rewards = [judgment_reward(v, x.label) for v in verdicts]
            correct += rewards
            parsed += [v is not None for v in verdicts]
            for g, advantage, text, verdict in zip(group, group_advantages(rewards), texts, verdicts):
                samples.append(TrainSample.from_turn(prompts[i], g.token_ids, old_logprobs=g.logprobs,
                                                     advantages=[advantage] * len(g.token_ids)))
                if not x.label and verdict is False:
                    self.critiques.append((x.step.action or x.step.response, critique(text)))
        self.critiques = self.critiques[-cfg.max_critiques:]
        metrics.update({"judge_accuracy": statistics.fmean(correct), "verdict_parse_rate": statistics.fmean(parsed)})
        return AuxBatch(samples, metrics)

    @torch.no_grad()
    def evaluate(self, trajectories, seed: int) -> dict[str, float]:
        """Judge accuracy on a balanced sample of labelled steps (greedy verdicts)."""
        chosen = eval_pairs(self, trajectories, seed)
        if not chosen:
            return {}
        params = self.config.sampling.model_copy(update={"temperature": 0.0})
        prompts = [judge_ids(self.tokenizer, x.step, self.turns) for x in chosen]
        verdicts = [parse_verdict(self.tokenizer.decode(g.token_ids, skip_special_tokens=True))
                    for g in self.sampler.generate(prompts, params)]
        return {"judge_accuracy": statistics.fmean(v == x.label for v, x in zip(verdicts, chosen)),
                "verdict_parse_rate": statistics.fmean(v is not None for v in verdicts), "judge_pairs": len(chosen)}

    def token_loss(self, logp: torch.Tensor, batch: TokenBatch) -> torch.Tensor:
        segments = torch.zeros_like(logp, dtype=torch.long)
        loss, _ = ppo_clip(logp, batch.old_logprobs, batch.advantages, segments, self.config.clip)
        return loss

    def loss(self, actor, batch):
        return self.token_loss(actor.token_logprobs(batch)[0], batch), {}


class ClassifierJudgeLoss(Component):
    """The GCD ablation with a value-head classifier instead of the generative judge: a linear
    head on the actor's final hidden state at the end of the same judge prompt (where the
    generative judge would start its answer) predicts good / bad; binary cross-entropy on the
    same balanced labelled pairs joins the RL loss in the same optimiser step. The head's
    parameters are optimised with the actor's (`extra_parameters`) and saved in checkpoints."""

    def __init__(self, config, model, tokenizer, seed: int, external=None, turns: ChatTurns | None = None):
        self.config, self.name, self.weight = config, config.name, config.weight
        self.model, self.tokenizer, self.seed, self.external = model, tokenizer, seed, external
        self.turns = turns
        self.head = torch.nn.Linear(model.config.hidden_size, 1, dtype=model.dtype, device=model.device)
        torch.nn.init.zeros_(self.head.weight)
        torch.nn.init.zeros_(self.head.bias)

    def parameters(self):
        return list(self.head.parameters())

    def fits(self, step) -> bool:
        return fits(self.tokenizer, step, self.turns, getattr(self.model.config, "max_position_embeddings", None), 1)

    def loss(self, actor, batch):
        return self.hidden_loss(actor.token_hidden(batch), batch)

    def _sample(self, labelled) -> TrainSample:
        ids = judge_ids(self.tokenizer, labelled.step, self.turns)
        # One trained position: the hidden state that would predict the answer's first token.
        return TrainSample(ids + [self.tokenizer.eos_token_id], [False] * len(ids) + [True],
                           target=[float(labelled.label)])

    def prepare(self, trajectories, step: int) -> AuxBatch:
        chosen, metrics = select_pairs(self, trajectories, step)
        return AuxBatch([self._sample(x) for x in chosen], metrics)

    def hidden_loss(self, hidden: torch.Tensor, batch: TokenBatch):
        """Per-sample BCE (N,) from the hidden states (N, H), and the number judged right
        (the trainer divides by the sample count)."""
        logits = self.head(hidden).squeeze(-1).float()
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, batch.target, reduction="none")
        return loss, {"judge_accuracy": ((logits > 0).float() == batch.target).float().sum().detach()}

    @torch.no_grad()
    def evaluate(self, trajectories, seed: int) -> dict[str, float]:
        chosen = eval_pairs(self, trajectories, seed)
        if not chosen:
            return {}
        batch = collate([self._sample(x) for x in chosen], self.tokenizer.pad_token_id)
        hidden = trained_hidden(self.model, batch)
        _, metrics = self.hidden_loss(hidden, batch.to(hidden.device))
        return {"judge_accuracy": float(metrics["judge_accuracy"]) / len(chosen), "judge_pairs": len(chosen)}

    def save(self, path) -> None:
        path.mkdir(parents=True, exist_ok=True)
        save_file(self.head.state_dict(), path / "head.safetensors")

    def load(self, path) -> None:
        self.head.load_state_dict(load_file(path / "head.safetensors"))


@AUX_LOSSES.register("gcd", GCDAuxConfig)
def gcd(config, ctx):
    ext = config.external
    endpoint = ext and ChatEndpoint(ext.base_url, ext.model, ext.api_key_env, ext.timeout_s, ext.retries,
                                    ext.backoff_s)
    external = ext and ExternalJudge(endpoint, ext.asks, ext.agree, ext.temperature, ext.max_tokens)
    seed = ctx.config.seed
    turns = ChatTurns(ctx.tokenizer) if ctx.config.prompt.full_history else None
    if config.judge == "classifier":
        return ClassifierJudgeLoss(config, ctx.policy, ctx.tokenizer, seed, external, turns)
    return GCDLoss(config, ctx.sampler, ctx.tokenizer, seed, external, endpoint, ctx.run_dir, turns)
