"""PPO with a learned critic: GAE over environment steps with the critic's V(s).

The entry brings the critic as a trainer component (`agentrl.critic.CriticComponent`), which
fills `StepSample.value` before this runs and regresses onto `returns` after the update.
Per trajectory, with r'_t = r_t - penalty_t (the invalid-action penalty is part of the reward
here, since the critic must predict it): delta_t = r'_t + gamma * V_{t+1} - V_t with V = 0
after the last step, A_t = delta_t + gamma * lambda * A_{t+1}, and the critic's target is
R_t = A_t + V_t. The advantages are then whitened over the whole batch (no groups: the critic is
the baseline).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from agentrl.advantages.common import Advantages, gae, normalize, register
from agentrl.config import Section


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

    def one_process_only(self) -> str:
        return "the ppo critic"


def critic_components(config, ctx):
    from agentrl.critic import critic_components as build
    return build(config, ctx)


@register("ppo", PPOConfig, components=critic_components)
def ppo(trajectories, config) -> Advantages:
    raw, returns = [], []
    for t in trajectories:
        if any(s.value is None for s in t.steps):
            raise ValueError("the ppo estimator needs critic values on every step (StepSample.value)")
        values = [s.value for s in t.steps]
        adv = gae([s.reward - s.penalty for s in t.steps], values, config.gamma, config.lam)
        raw.append(adv)
        returns.append([a + value for a, value in zip(adv, values)])
    if config.normalize:  # whitened over the whole batch
        flat = [a for adv in raw for a in adv]
        whitened = iter(normalize(flat, flat, "sample", config.eps))
        raw = [[next(whitened) for _ in adv] for adv in raw]
    return Advantages(raw, returns=returns)
