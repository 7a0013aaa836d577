"""Gradient coupling between samples: gradient similarity, one-step influence, representations.

A sample is a (prompt, response) pair; its loss is -log p(response | prompt) summed over the
response tokens (the quantity an RL update pushes up or down, up to the advantage).
"""

from __future__ import annotations

import itertools
import statistics
from dataclasses import dataclass
from typing import ClassVar, Literal

import torch
import torch.nn.functional as F
from pydantic import Field

from agentrl.components import Component, Context, StepBatch
from agentrl.config import Section
from agentrl.distributed import model_device
from agentrl.prompting import encode_prompt
from agentrl.registry import COMPONENTS
from agentrl.seeding import step_seed


@dataclass
class Pair:
    prompt: str
    response: str
    label: bool | None = None
    """Good (True) / bad (False) action, where known."""


def _encode(model, tokenizer, pair: Pair) -> tuple[torch.Tensor, int]:
    prompt_ids = encode_prompt(tokenizer, pair.prompt)
    response_ids = tokenizer(pair.response, add_special_tokens=False).input_ids
    return torch.tensor([prompt_ids + response_ids], device=model_device(model)), len(prompt_ids)


def response_logprob(model, tokenizer, pair: Pair) -> torch.Tensor:
    """log p(response | prompt), a scalar (with grad when enabled)."""
    ids, n_prompt = _encode(model, tokenizer, pair)
    logits = model(input_ids=ids).logits[0, n_prompt - 1:-1].float()  # (R, V): predictions of the response
    return torch.log_softmax(logits, -1).gather(-1, ids[0, n_prompt:, None]).sum()


def _params(model) -> list[torch.nn.Parameter]:
    return [p for p in model.parameters() if p.requires_grad]


def mean_gradient(model, tokenizer, pairs: list[Pair]) -> torch.Tensor:
    """Mean over `pairs` of the gradient of log p(response | prompt), flattened (P,)."""
    params = _params(model)
    total = torch.zeros(sum(p.numel() for p in params), dtype=torch.float64, device=params[0].device)
    for pair in pairs:
        grads = torch.autograd.grad(response_logprob(model, tokenizer, pair), params)
        total += torch.cat([g.reshape(-1).double() for g in grads])
    return total / max(len(pairs), 1)


def gradient_similarity(model, tokenizer, sets: dict[str, list[Pair]]) -> dict[str, float]:
    """Cosine similarity between the mean gradients of every two sample sets ("a|b" -> cos)."""
    means = {name: mean_gradient(model, tokenizer, pairs) for name, pairs in sets.items() if pairs}
    return {f"{a}|{b}": F.cosine_similarity(means[a], means[b], dim=0).item()
            for a, b in itertools.combinations(means, 2)}


def one_step_influence(model, tokenizer, pairs: list[Pair], lr: float) -> torch.Tensor:
    """(n, n) matrix: entry (i, j) is the change of log p(y_j | x_j) after one SGD step of size
    `lr` that raises log p(y_i | x_i). The model is restored after each step."""
    params = _params(model)
    saved = [p.detach().clone() for p in params]
    with torch.no_grad():
        before = torch.stack([response_logprob(model, tokenizer, p) for p in pairs])
    matrix = torch.zeros(len(pairs), len(pairs))
    for i, pair in enumerate(pairs):
        grads = torch.autograd.grad(response_logprob(model, tokenizer, pair), params)
        with torch.no_grad():
            for p, g in zip(params, grads):
                p.add_(g, alpha=lr)
            after = torch.stack([response_logprob(model, tokenizer, q) for q in pairs])
            for p, s in zip(params, saved):
                p.copy_(s)
        matrix[i] = (after - before).cpu()
    return matrix


def influence_gap(matrix: torch.Tensor, labels: list[bool]) -> dict[str, float]:
    """Mean off-diagonal influence between samples of the same class vs of different classes
    (the papers' Figure 8: a large same-class share means good and bad actions are decoupled)."""
    same, different = [], []
    for i, j in itertools.permutations(range(len(labels)), 2):
        (same if labels[i] == labels[j] else different).append(matrix[i, j].item())
    out = {"influence_same_class": statistics.fmean(same) if same else 0.0,
           "influence_different_class": statistics.fmean(different) if different else 0.0}
    out["influence_gap"] = out["influence_same_class"] - out["influence_different_class"]
    return out


@torch.no_grad()
def action_representations(model, tokenizer, pairs: list[Pair]) -> torch.Tensor:
    """(n, H): last-layer hidden state averaged over each response's tokens."""
    rows = []
    for pair in pairs:
        ids, n_prompt = _encode(model, tokenizer, pair)
        hidden = model(input_ids=ids, output_hidden_states=True).hidden_states[-1][0, n_prompt:]
        rows.append(hidden.float().mean(0))
    return torch.stack(rows).cpu()


def representation_separation(reps: torch.Tensor, labels: list[bool]) -> dict[str, float]:
    """Mean cosine similarity within classes and across, and their difference (separation)."""
    normed = F.normalize(reps, dim=-1)
    cos = normed @ normed.T
    within, across = [], []
    for i, j in itertools.combinations(range(len(labels)), 2):
        (within if labels[i] == labels[j] else across).append(cos[i, j].item())
    out = {"cos_within_class": statistics.fmean(within) if within else 0.0,
           "cos_across_class": statistics.fmean(across) if across else 0.0}
    out["separation"] = out["cos_within_class"] - out["cos_across_class"]
    return out


def save_heatmap(matrix: torch.Tensor, labels: list[str], path, title: str) -> bool:
    """Write the influence matrix as a PNG; False (nothing written) without matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(1 + 0.35 * len(labels), 1 + 0.35 * len(labels)))
    bound = matrix.abs().max().item() or 1.0
    image = ax.imshow(matrix.numpy(), cmap="RdBu", vmin=-bound, vmax=bound)
    ax.set_xticks(range(len(labels)), labels, rotation=90, fontsize=6)
    ax.set_yticks(range(len(labels)), labels, fontsize=6)
    ax.set_xlabel("measured sample j")
    ax.set_ylabel("trained sample i")
    ax.set_title(title, fontsize=8)
    fig.colorbar(image, ax=ax)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def labelled_pairs(trajectories, n: int, seed: int) -> tuple[list[Pair], list[Pair]]:
    """Up to n good and n bad (prompt, response) pairs of recorded steps, labelled by the
    environment's progress flag and the GCD rules."""
    import random

    from agentrl.gcd.labels import label_steps

    labelled = [x for x in label_steps(trajectories, ["env", "rules"]) if x.step.prompt]
    rng = random.Random(seed)
    rng.shuffle(labelled)
    good = [Pair(x.step.prompt, x.step.response, True) for x in labelled if x.label][:n]
    bad = [Pair(x.step.prompt, x.step.response, False) for x in labelled if not x.label][:n]
    return good, bad


def coupling_metrics(model, tokenizer, trajectories, pairs: int, lr: float, seed: int) -> dict[str, float]:
    """The lab's summary numbers on one set of trajectories (logged during training): cosine of
    the mean gradients of good and bad steps, influence gap, representation separation."""
    good, bad = labelled_pairs(trajectories, pairs // 2, seed)
    if not good or not bad:
        return {}
    out = {"grad_cos_pos_neg": gradient_similarity(model, tokenizer, {"pos": good, "neg": bad})["pos|neg"]}
    chosen, labels = good + bad, [True] * len(good) + [False] * len(bad)
    out.update(influence_gap(one_step_influence(model, tokenizer, chosen, lr), labels))
    out.update(representation_separation(action_representations(model, tokenizer, chosen), labels))
    return out


def coupling_report(model, tokenizer, in_domain, out_of_domain, samples: int, influence_pairs: int,
                    lr: float, seed: int, out_dir) -> dict:
    """The lab on trajectory sets: gradient similarity table, one-step influence (+ heatmap),
    influence gap and representation separation; written to out_dir/coupling.json."""
    import json
    from pathlib import Path

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    good_id, bad_id = labelled_pairs(in_domain, samples, seed)
    sets = {"pos_id": good_id, "neg_id": bad_id}
    if out_of_domain:
        sets["pos_ood"], sets["neg_ood"] = labelled_pairs(out_of_domain, samples, seed)
    report = {"set_sizes": {k: len(v) for k, v in sets.items()},
              "gradient_cosine": gradient_similarity(model, tokenizer, sets)}
    k = min(influence_pairs // 2, len(good_id), len(bad_id))
    chosen = good_id[:k] + bad_id[:k]
    if k:
        labels = [p.label for p in chosen]
        matrix = one_step_influence(model, tokenizer, chosen, lr)
        report.update(influence_gap(matrix, labels))
        report.update(representation_separation(action_representations(model, tokenizer, chosen), labels))
        report["influence_matrix"] = matrix.tolist()
        names = [f"{'+' if p.label else '-'}{i}" for i, p in enumerate(chosen)]
        report["heatmap"] = save_heatmap(matrix, names, out_dir / "influence.png",
                                         f"one-step influence (lr {lr}); + good, - bad")
    (out_dir / "coupling.json").write_text(json.dumps(report, indent=2))
    return report


class CouplingLabConfig(Section):
    """The gradient-coupling lab during training: every `every` steps, before the update, on the
    step's own labelled rollouts: coupling/{grad_cos_pos_neg, influence_on_pos_of_neg, ...}."""

    type: Literal["coupling"] = "coupling"
    """Component name in the registry."""
    every: int = Field(1, ge=1)
    """Measure on every N-th step."""
    pairs: int = Field(8, ge=2)
    """Labelled steps (half good, half bad) the lab uses."""
    lr: float = Field(1e-3, gt=0)
    """Step size of the lab's one-step influence."""
    reads_policy: ClassVar[bool] = True  # gradients of a full HF copy of the policy
    reads_prompt_text: ClassVar[bool] = True  # the pairs are re-encoded from their prompt text


@COMPONENTS.register("coupling", CouplingLabConfig)
class CouplingLab(Component):
    """The lab on each `every`-th step's own labelled rollouts, before the update: coupling/*."""

    name = "coupling"

    def __init__(self, config: CouplingLabConfig, ctx: Context):
        self.policy, self.tokenizer, self.config, self.seed = ctx.policy, ctx.tokenizer, config, ctx.config.seed

    def shape(self, batch: StepBatch) -> None:
        cfg = self.config
        if batch.step % cfg.every == 0:
            found = coupling_metrics(self.policy, self.tokenizer, batch.trajectories, cfg.pairs, cfg.lr,
                                     step_seed(self.seed, batch.step, "coupling"))
            batch.metrics.update({f"coupling/{k}": v for k, v in found.items()})
