"""RLVMR (arXiv 2507.22844): GRPO plus verifiable rewards for meta-reasoning tags.

Each step's response carries one reasoning tag (`agentrl.prompting.reasoning_tag`). The
rule-checked meta rewards of a step, by its tag:
- planning: `planning_reward` if the episode succeeded;
- explore: `explore_reward` if the action led to a state not seen earlier in the episode (the
  next step's anchor is new; the last step counts as new when it ended the episode in success);
- reflection: `reflection_reward` if the previous step was ineffective (invalid, or the state did
  not change) and this step's action is valid and differs from the previous one;
- monitor (and think): no meta reward.
The meta rewards are normalised per tag type within the task group (mean-std over the group's
steps carrying that tag; a tag type with a single step gives 0), and
A_t = A_GRPO + meta_weight * A_meta(t), where A_GRPO is the `grpo` estimator's advantage with the
same `level` / `normalize_std` settings. Steps without a meta tag get A_GRPO only.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Literal

from pydantic import Field

from agentrl.advantages.common import Advantages, normalize, register
from agentrl.advantages.grpo import grpo
from agentrl.config import Section
from agentrl.prompting import META_TAGS, reasoning_tag
from agentrl.rollout.types import group_by_id


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


def meta_rewards(traj, config) -> list[tuple[str | None, float]]:
    """(meta tag or None, meta reward) of every step of one trajectory."""
    out = []
    for t, step in enumerate(traj.steps):
        tag = reasoning_tag(step.response)
        reward = 0.0
        if tag == "planning":
            reward = config.planning_reward * traj.success
        elif tag == "explore":
            seen = {s.anchor for s in traj.steps[:t + 1]}
            new = traj.steps[t + 1].anchor not in seen if t + 1 < traj.length else traj.success
            reward = config.explore_reward * new
        elif tag == "reflection" and t > 0:
            prev = traj.steps[t - 1]
            ineffective = not prev.valid or prev.anchor == step.anchor
            reward = config.reflection_reward * (ineffective and step.valid and step.action != prev.action)
        out.append((tag if tag in META_TAGS else None, float(reward)))
    return out


@register("rlvmr", RLVMRConfig)
def rlvmr(trajectories, config) -> Advantages:
    base = grpo(trajectories, config).values
    index = {id(t): i for i, t in enumerate(trajectories)}
    values = [list(v) for v in base]
    counts: dict[str, int] = defaultdict(int)
    for group in group_by_id(trajectories).values():
        rewards = {id(t): meta_rewards(t, config) for t in group}
        pools: dict[str, list[float]] = defaultdict(list)
        for t in group:
            for tag, r in rewards[id(t)]:
                if tag is not None:
                    pools[tag].append(r)
                    counts[tag] += 1
        for t in group:
            row = values[index[id(t)]]
            for i, (tag, r) in enumerate(rewards[id(t)]):
                if tag is not None:
                    row[i] += config.meta_weight * normalize([r], pools[tag], "sample", config.eps)[0]
    total = max(sum(len(t.steps) for t in trajectories), 1)
    return Advantages(values, {f"meta_share_{tag}": counts[tag] / total for tag in META_TAGS})
