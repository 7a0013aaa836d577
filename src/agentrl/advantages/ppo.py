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

from agentrl.advantages.common import Advantages, gae, normalize, register
from agentrl.config import PPOConfig


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
