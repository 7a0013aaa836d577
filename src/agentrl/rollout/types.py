"""Rollout records: one `StepSample` per environment step, grouped into `Trajectory`s."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class StepSample:
    prompt_ids: list[int]
    response_ids: list[int]
    logprobs: list[float]
    """Sampler log-probs of `response_ids` (the "old" policy of the update)."""
    response: str
    action: str | None
    """Parsed action; None when the response had none (an invalid step)."""
    observation: str
    """The current observation the prompt showed (raw text, no template)."""
    anchor: str
    """State key for grouping identical states inside a task group."""
    reward: float = 0.0
    """Environment reward of this step."""
    penalty: float = 0.0
    """Invalid-action penalty of this step (subtracted after any discounting)."""
    prompt: str = ""
    """The prompt text the actor saw (before the chat template); GCD judges in this context."""
    progress: bool | None = None
    """The environment's own judgement of the action, where it has one (GCD label source)."""
    value: float | None = None
    """The critic's V of the step's state (PPO with a critic only)."""
    advantage: float | None = None
    """The step's advantage, set by the trainer before the update (None until then, and for
    steps of groups left out of the update)."""
    rejected: int = 0
    """Moves the environment rejected in this state before this one (`sampling.retries` judged
    by an environment's `try_step`); they are not trained on."""

    @property
    def valid(self) -> bool:
        return self.action is not None


@dataclass
class Trajectory:
    task_id: str
    group_id: int
    """Rollouts of one task instance share a group id (never keyed by worker)."""
    task_type: str
    steps: list[StepSample] = field(default_factory=list)
    success: bool = False
    aborted: bool = False
    """The worker failed mid-episode; the trajectory is kept out of the advantage computation."""
    version: int | None = None
    """The policy that sampled it: the weights after this many updates (None: not recorded)."""
    context_ended: bool = False
    """With `prompt.full_history`: ended because its next prompt and a reply of `max_new_tokens`
    would pass the sampler's context (`Sampler.context_length`); like running out of `env.max_steps`."""

    @property
    def episode_reward(self) -> float:
        return sum(s.reward for s in self.steps)

    @property
    def score(self) -> float:
        """The episode's summed reward clipped at 0: ScienceWorld's score as its paper's agents are
        scored (the ScienceWorld authors' DRRN scorer counts a failed task, -100, as 0)."""
        return max(0.0, self.episode_reward)

    @property
    def length(self) -> int:
        return len(self.steps)

    @property
    def repeated_actions(self) -> int:
        """Steps whose action equals the previous step's action."""
        actions = [s.action for s in self.steps]
        return sum(1 for a, b in zip(actions, actions[1:]) if b is not None and a == b)


def group_by_id(trajectories: list[Trajectory]) -> dict[int, list[Trajectory]]:
    groups: dict[int, list[Trajectory]] = {}
    for traj in trajectories:
        groups.setdefault(traj.group_id, []).append(traj)
    return groups


def differing_groups(trajectories: list[Trajectory]) -> list[int]:
    """Ids of the groups, in order, with no episode aborted whose episodes' returns are not all
    the same (to 1e-9: the same rewards summed in another order count as the same)."""
    ids = []
    for group_id, group in group_by_id(trajectories).items():
        returns = [t.episode_reward for t in group]
        if not any(t.aborted for t in group) and max(returns) - min(returns) > 1e-9:
            ids.append(group_id)
    return ids
