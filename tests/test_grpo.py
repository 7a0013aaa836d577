import pytest

from agentrl.advantages import compute_advantages
from agentrl.advantages.grpo import GRPOConfig
from agentrl.rollout.types import StepSample, Trajectory


def traj(group, rewards, invalid=()):
    steps = []
    for i, r in enumerate(rewards):
        steps.append(StepSample(prompt_ids=[1], response_ids=[2], logprobs=[0.0], response="",
                                action=None if i in invalid else "look", observation="o", anchor="o",
                                reward=r, penalty=0.1 if i in invalid else 0.0))
    return Trajectory(task_id=f"t{group}", group_id=group, task_type="x", steps=steps)


def test_step_level_grpo_by_hand():
    # Group 0: a 2-step success (R=10) and a 1-step failure (R=0). Step scores: [10, 10, 0].
    # mean = 20/3, unbiased std = sqrt(((10/3)^2 * 2 + (20/3)^2) / 2) = sqrt(100/3) = 5.7735
    a, b = traj(0, [0, 10]), traj(0, [0])
    out = compute_advantages([a, b], GRPOConfig(eps=0.0))
    assert out.values[0] == pytest.approx([0.57735, 0.57735], abs=1e-5)
    assert out.values[1] == pytest.approx([-1.1547], abs=1e-4)


def test_trajectory_level_grpo_and_penalty_by_hand():
    # Episodes R = 10 and 0: mean 5, unbiased std = 7.0711. The invalid step (penalty 0.1)
    # scores 10 - 0.1: (9.9 - 5) / 7.0711 = 0.69296.
    a, b = traj(0, [0, 10], invalid={0}), traj(0, [0, 0])
    out = compute_advantages([a, b], GRPOConfig(level="trajectory", eps=0.0))
    assert out.values[0] == pytest.approx([0.69296, 0.70711], abs=1e-5)
    assert out.values[1] == pytest.approx([-0.70711, -0.70711], abs=1e-5)


def test_groups_are_separate_and_mean_only_variant():
    a, b = traj(0, [10]), traj(0, [0])
    c, d = traj(1, [10]), traj(1, [10])
    out = compute_advantages([a, c, b, d], GRPOConfig(normalize_std=False))
    assert out.values == [[5.0], [0.0], [-5.0], [0.0]]


def test_singleton_group_gets_zero():
    out = compute_advantages([traj(3, [10])], GRPOConfig())
    assert out.values == [[0.0]]
