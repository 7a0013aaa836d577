"""Hand-computed values for the step-level estimators on crafted groups."""

import pytest

from agentrl.advantages import compute_advantages
from agentrl.advantages.gagpo import GAGPOConfig
from agentrl.advantages.gigpo import GiGPOConfig
from agentrl.advantages.grpo import GRPOConfig
from agentrl.advantages.ppo import PPOConfig
from agentrl.advantages.rloo import RLOOConfig
from agentrl.advantages.rlvmr import RLVMRConfig
from agentrl.rollout.types import StepSample, Trajectory


def traj(group, anchors, rewards, invalid=()):
    steps = [StepSample(prompt_ids=[1], response_ids=[2], logprobs=[0.0], response="",
                        action=None if i in invalid else "look", observation=a, anchor=a, reward=r,
                        penalty=0.1 if i in invalid else 0.0)
             for i, (a, r) in enumerate(zip(anchors, rewards))]
    return Trajectory(task_id=f"t{group}", group_id=group, task_type="x", steps=steps)


def crafted():
    # A succeeds through s0 -> s1; B fails through s0 -> s2 with an invalid last step.
    return [traj(0, ["s0", "s1"], [0, 10]), traj(0, ["s0", "s2"], [0, 0], invalid={1})]


def test_rloo_by_hand():
    group = [traj(0, ["a"], [10]), traj(0, ["a", "b"], [0, 0], invalid={0}), traj(0, ["c"], [0])]
    out = compute_advantages(group + [traj(1, ["z"], [10])], RLOOConfig())
    assert out.values == [[10.0], [pytest.approx(-5.1), -5.0], [-5.0], [0.0]]


def test_gigpo_by_hand():
    # Episode: R = 10, 0 -> +-0.70711. Returns (gamma 0.5): A [5, 10], B [0, 0 - 0.1].
    # Anchor s0 holds {5, 0} -> +-0.70711; s1 and s2 are singletons -> 0.
    out = compute_advantages(crafted(), GiGPOConfig(gamma=0.5, eps=0.0))
    assert out.values[0] == pytest.approx([1.41421, 0.70711], abs=1e-5)
    assert out.values[1] == pytest.approx([-1.41421, -0.70711], abs=1e-5)
    assert out.metrics == {"anchor_singleton_share": pytest.approx(2 / 3), "anchor_mean_size": pytest.approx(4 / 3)}
    mean_only = compute_advantages(crafted(), GiGPOConfig(gamma=0.5, eps=0.0, step_std=False, step_weight=2.0))
    assert mean_only.values[0] == pytest.approx([0.70711 + 5.0, 0.70711], abs=1e-5)


def test_gagpo_by_hand():
    # Returns (gamma 0.5): A [5, 10], B [0, 0]; V(s0) = 2.5, V(s1) = 10, V(s2) = 0, V(end) = 0.
    # A: delta = [0 + 0.5*10 - 2.5, 10 - 10] = [2.5, 0] -> GAE (lambda 0.5) [2.5, 0]
    # B: delta = [0 + 0.5*0 - 2.5, 0 - 0] = [-2.5, 0] -> [-2.5, 0], penalty -> [-2.5, -0.1]
    # Centred over the group (mean -0.025): A [2.525, 0.025], B [-2.475, -0.075]
    out = compute_advantages(crafted(), GAGPOConfig(gamma=0.5, lam=0.5, normalize_std=False))
    assert out.values[0] == pytest.approx([2.525, 0.025])
    assert out.values[1] == pytest.approx([-2.475, -0.075])
    assert out.metrics == {"anchor_singleton_share": pytest.approx(2 / 3), "anchor_mean_size": pytest.approx(4 / 3)}


def test_gagpo_gae_accumulates_over_steps():
    # Two rollouts share state "x" (returns 8 and 0), so V(x) is their mean.
    group = [traj(0, ["x", "y", "z"], [0, 0, 8]), traj(0, ["x"], [0])]
    # gamma 1: returns A [8, 8, 8], B [0]; V(x) = 4, V(y) = 8, V(z) = 8.
    # A: delta = [0 + 8 - 4, 0 + 8 - 8, 8 - 8] = [4, 0, 0]; lambda 1 -> A [4, 0, 0]. B: delta = [0 - 4] -> [-4]
    out = compute_advantages(group, GAGPOConfig(gamma=1.0, lam=1.0, normalize_std=False))
    assert out.values == [[pytest.approx(4.0), 0.0, 0.0], [pytest.approx(-4.0)]]


def with_values(t, values):
    for s, v in zip(t.steps, values):
        s.value = v
    return t


def test_ppo_gae_by_hand():
    # gamma 0.5, lambda 0.5. A: rewards [0, 10], V [2, 6]: delta = [0 + 0.5*6 - 2, 10 - 6] = [1, 4]
    #   -> A = [1 + 0.25*4, 4] = [2, 4], targets [4, 10].
    # B: rewards [0, 0], last step invalid (penalty 0.1), V [1, 1]: delta = [0 + 0.5 - 1, -0.1 - 1]
    #   = [-0.5, -1.1] -> A = [-0.5 - 0.275, -1.1] = [-0.775, -1.1], targets [0.225, -0.1].
    group = [with_values(crafted()[0], [2, 6]), with_values(crafted()[1], [1, 1])]
    out = compute_advantages(group, PPOConfig(gamma=0.5, lam=0.5, normalize=False))
    assert out.values[0] == pytest.approx([2.0, 4.0])
    assert out.values[1] == pytest.approx([-0.775, -1.1])
    assert out.returns[0] == pytest.approx([4.0, 10.0])
    assert out.returns[1] == pytest.approx([0.225, -0.1])
    whitened = compute_advantages(group, PPOConfig(gamma=0.5, lam=0.5))
    flat = [a for v in whitened.values for a in v]
    assert sum(flat) == pytest.approx(0.0, abs=1e-9)
    assert whitened.returns == out.returns  # targets are never whitened


def test_ppo_needs_critic_values():
    with pytest.raises(ValueError, match="critic values"):
        compute_advantages(crafted(), PPOConfig())


def tagged(group, steps, success):
    """steps: (anchor, tag, action, reward); action None for an invalid step."""
    out = [StepSample(prompt_ids=[1], response_ids=[2], logprobs=[0.0],
                      response=f"<{tag}>x</{tag}><action>{action}</action>", action=action, observation=a,
                      anchor=a, reward=r, penalty=0.0 if action else 0.1)
           for a, tag, action, r in steps]
    return Trajectory(task_id="t", group_id=group, task_type="x", steps=out, success=success)


def test_rlvmr_by_hand():
    a = tagged(0, [("s0", "planning", "go to x", 0), ("s1", "explore", "take a", 10)], success=True)
    b = tagged(0, [("s0", "planning", "go to x", 0), ("s2", "explore", "go to y", 0),
                   ("s2", "reflection", "open z", 0)], success=False)
    # Meta rewards: A planning 1 (success), explore 1 (last step of a success);
    # B planning 0, explore 0 (s2 -> s2 is not new), reflection 1 (previous step left s2 unchanged).
    # Per-tag normalisation: planning [1, 0] -> +-0.70711, explore [1, 0] -> +-0.70711,
    # reflection [1] is a singleton -> 0. GRPO (step level): scores [10, 10, 0, 0, 0], mean 4,
    # std sqrt(30) -> A 1.09545, B -0.73030.
    out = compute_advantages([a, b], RLVMRConfig(eps=0.0))
    assert out.values[0] == pytest.approx([1.80256, 1.80256], abs=1e-5)
    assert out.values[1] == pytest.approx([-1.43741, -1.43741, -0.73030], abs=1e-5)
    assert out.metrics["meta_share_reflection"] == pytest.approx(1 / 5)
    # meta_weight scales the meta part only
    half = compute_advantages([a, b], RLVMRConfig(eps=0.0, meta_weight=0.5))
    assert half.values[0] == pytest.approx([1.09545 + 0.5 * 0.70711] * 2, abs=1e-5)
    # an explore step that ends a failed episode found nothing new to end in
    from agentrl.advantages.rlvmr import meta_rewards
    assert meta_rewards(tagged(0, [("s0", "explore", "go to x", 0)], success=False), RLVMRConfig()) == [("explore", 0.0)]
    # each tag's reward is its own setting's value
    scaled = RLVMRConfig(planning_reward=2.0, explore_reward=3.0, reflection_reward=4.0)
    assert [r for _, r in meta_rewards(a, scaled)] == [2.0, 3.0]
    assert [r for _, r in meta_rewards(b, scaled)] == [0.0, 0.0, 4.0]
    # No meta tags (plain <think>): exactly GRPO.
    plain = tagged(0, [("s0", "think", "go to x", 10)], True), tagged(0, [("s0", "think", "look", 0)], False)
    assert compute_advantages(list(plain), RLVMRConfig()).values == compute_advantages(list(plain), GRPOConfig()).values


def test_rlvmr_reflection_needs_an_ineffective_previous_step():
    # The previous step moved s0 -> s1 (effective): no reflection reward for either rollout,
    # so the reflection pool [0, 0] normalises to 0.
    a = tagged(0, [("s0", "monitor", "go to x", 0), ("s1", "reflection", "open y", 10)], success=True)
    b = tagged(0, [("s0", "monitor", "go to x", 0), ("s1", "reflection", "go to x", 0)], success=False)
    out = compute_advantages([a, b], RLVMRConfig())
    base = compute_advantages([a, b], GRPOConfig())
    assert out.values == base.values
    # After an invalid step, a different valid action is rewarded; repeating it is not.
    c = tagged(1, [("s0", "monitor", None, 0), ("s0", "reflection", "open y", 0)], success=False)
    d = tagged(1, [("s0", "monitor", "look", 0), ("s0", "reflection", "look", 0)], success=False)
    from agentrl.advantages.rlvmr import meta_rewards
    assert meta_rewards(c, RLVMRConfig())[1] == ("reflection", 1.0)
    assert meta_rewards(d, RLVMRConfig())[1] == ("reflection", 0.0)


def two_groups():
    """Two task groups that reuse the same anchor names (s0, s1) with different outcomes, and
    invalid steps in both, so that pooling across groups, dropping the penalty or the discount,
    or a missing recursion each change the numbers."""
    return [traj(0, ["s0", "s1"], [0, 10]),               # A: succeeds
            traj(0, ["s0", "s2"], [0, 0], invalid={1}),   # B: fails, invalid last step
            traj(1, ["s0", "s1"], [0, 0]),                # C: fails
            traj(1, ["s0"], [10]),                        # D: succeeds at once
            traj(1, ["s1", "s1"], [0, 10], invalid={0})]  # E: invalid first step, then succeeds


def test_gigpo_by_hand_with_two_task_groups():
    # gamma 0.9; step returns minus penalty: A [9, 10], B [0, -0.1], C [0, 0], D [10], E [8.9, 10].
    # Episode term within each group: group 0 rewards {10, 0} -> +-0.70711; group 1 {0, 10, 10}
    # (mean 6.667, std 5.7735) -> C -1.1547, D and E +0.57735.
    # Step term within each group's anchor groups: group 0 s0 {9, 0} -> +-0.70711, s1 and s2
    # singletons -> 0. Group 1 s0 {0, 10} -> C -0.70711, D +0.70711; s1 {C 0, E 8.9, E 10}
    # (mean 6.3, std 5.4836) -> C -1.14888, E 0.47414, 0.67474.
    out = compute_advantages(two_groups(), GiGPOConfig(gamma=0.9, eps=0.0))
    assert out.values == [pytest.approx(v, abs=1e-5) for v in
                          [[1.41421, 0.70711], [-1.41421, -0.70711], [-1.86181, -2.30358], [1.28446],
                           [1.05149, 1.25209]]]


def test_gagpo_by_hand_with_two_task_groups():
    # gamma 0.9, lambda 0.5 (gamma x lambda = 0.45). Discounted returns: A [9, 10], B [0, 0],
    # C [0, 0], D [10], E [9, 10]. State values per group: group 0 V(s0) 4.5, V(s1) 10, V(s2) 0;
    # group 1 V(s0) = mean(0, 10) = 5, V(s1) = mean(C 0, E 9, E 10) = 6.3333.
    # E: delta = [0 + 0.9 x 6.3333 - 6.3333, 10 - 6.3333] = [-0.63333, 3.66667]
    #    -> A_1 = 3.66667, A_0 = -0.63333 + 0.45 x 3.66667 = 1.01667, minus the penalty: 0.91667.
    # C: delta = [0 + 0.9 x 6.3333 - 5, 0 - 6.3333] = [0.7, -6.33333] -> [-2.15, -6.33333].
    # D: [10 - 5] = [5]. Group 1 raw {-2.15, -6.3333, 5, 0.91667, 3.66667}: mean 0.22, std 4.57647.
    # Group 0: A [4.5, 0], B [-4.5, -0.1]: mean -0.025, std 3.67457.
    out = compute_advantages(two_groups(), GAGPOConfig(gamma=0.9, lam=0.5, eps=0.0))
    assert out.values == [pytest.approx(v, abs=1e-5) for v in
                          [[1.23143, 0.0068], [-1.21783, -0.02041], [-0.51787, -1.43196], [1.04447],
                           [0.15223, 0.75313]]]


def test_grpo_step_level_by_hand_with_two_task_groups():
    # Step scores (episode reward minus the step's penalty): group 0 A [10, 10], B [0, -0.1]
    # (mean 4.975, std 5.80251); group 1 C [0, 0], D [10], E [9.9, 10] (mean 5.98, std 5.45912).
    out = compute_advantages(two_groups(), GRPOConfig(eps=0.0))
    assert out.values == [pytest.approx(v, abs=1e-5) for v in
                          [[0.866, 0.866], [-0.85739, -0.87462], [-1.09541, -1.09541], [0.73638],
                           [0.71806, 0.73638]]]


def test_critic_explained_variance_by_hand():
    """1 - Var(R - V) / Var(R): the critic's V against the returns it regresses onto."""
    from agentrl.critic import value_metrics

    returns, values = [1.0, 2.0, 3.0, 6.0], [1.0, 1.0, 4.0, 4.0]  # Var(R) 3.5, Var(R - V) 1.25, Var(V) 2.25
    metrics = value_metrics(values, returns)
    assert metrics["critic/explained_variance"] == pytest.approx(1 - 1.25 / 3.5)
    assert metrics["critic/value_mean"] == 2.5 and metrics["critic/return_mean"] == 3.0
    assert value_metrics(values, [2.0] * 4)["critic/explained_variance"] == 0.0  # returns without spread
    assert value_metrics([1.0], [2.0]) == {}  # one step sample: no variance to explain


def test_rlvmr_without_meta_tags_is_grpo_with_its_own_level_and_normalisation():
    """RLVMR's episode part is GRPO with RLVMR's `level`, `normalize_std` and `eps` (on groups
    whose episodes differ in length, so the two levels differ)."""
    results = {}
    for level in ("step", "trajectory"):
        for std in (True, False):
            rlvmr = compute_advantages(two_groups(), RLVMRConfig(level=level, normalize_std=std, eps=0.0)).values
            assert rlvmr == compute_advantages(two_groups(), GRPOConfig(level=level, normalize_std=std, eps=0.0)).values
            results[level, std] = rlvmr
    assert len({repr(v) for v in results.values()}) == 4


def test_a_non_finite_critic_update_is_skipped(tiny_model_dir):
    """A non-finite return (a broken reward) makes the value loss's gradient norm non-finite: the
    critic's weights are left as they were, and the next finite update moves them."""
    import random

    import torch

    from agentrl.critic import Critic

    critic = Critic(str(tiny_model_dir), PPOConfig(critic_lr=1e-3))
    prompts = [[5, 6, 7, 8], [5, 6, 9]]
    before = {k: v.clone() for k, v in critic.state_dict().items()}
    found = critic.update(prompts, [float("nan"), 1.0], [0.0, 0.0], 2, 10**4, random.Random(0))
    assert found["grad_norm"] != found["grad_norm"]  # NaN
    assert all(torch.equal(before[k], v) for k, v in critic.state_dict().items())
    critic.update(prompts, [1.0, -1.0], [0.0, 0.0], 2, 10**4, random.Random(0))
    assert any(not torch.equal(before[k], v) for k, v in critic.state_dict().items())
