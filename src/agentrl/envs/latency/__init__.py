"""Another environment behind a simulated latency (studying rollout scheduling apart from engines).

Every reset, step and expert's answer (DAgger's labels) first sleeps a log-normal time: median
`*_median_s`, shape `*_sigma` (the expert's: `step_sigma`; 0: constant), capped at `max_s`. The
delays are drawn from an unseeded generator: they change when things happen, never what happens,
so results stay those of the wrapped environment.
"""

from __future__ import annotations

import math
import random
import time
from typing import Annotated, Literal

from pydantic import Field

from agentrl.config import Section
from agentrl.envs.base import Observation, StepResult, make_env
from agentrl.registry import ENVIRONMENTS


class LatencyEnvConfig(Section):
    """Another environment behind a simulated log-normal latency per reset, step and expert answer (for
    studying rollout scheduling; results are the wrapped environment's)."""

    type: Literal["latency"] = "latency"
    """Environment name in the registry."""
    inner: Annotated[Section, ENVIRONMENTS.field("household")] = Field(default_factory=lambda: ENVIRONMENTS.make("household"))
    """The wrapped environment's section."""
    step_median_s: float = Field(0.05, ge=0)
    """Median delay of a step (0: none)."""
    step_sigma: float = Field(1.0, ge=0)
    """Log-normal shape of the step delay (0: constant; 1: the slowest of 128 is ~10x the median)."""
    reset_median_s: float = Field(0.0, ge=0)
    """Median delay of a reset (0: none)."""
    reset_sigma: float = Field(0.0, ge=0)
    """Log-normal shape of the reset delay."""
    expert_median_s: float = Field(0.0, ge=0)
    """Median delay of the expert's answer (DAgger's labels; shaped by `step_sigma`)."""
    max_s: float = Field(10.0, gt=0)
    """Cap on any one delay."""


@ENVIRONMENTS.register("latency", LatencyEnvConfig)
class LatencyEnv:
    def __init__(self, inner, step_median_s: float = 0.05, step_sigma: float = 1.0, reset_median_s: float = 0.0,
                 reset_sigma: float = 0.0, expert_median_s: float = 0.0, max_s: float = 10.0):
        self.inner = make_env(inner)
        self.max_steps = self.inner.max_steps
        self.delays = {"step": (step_median_s, step_sigma), "reset": (reset_median_s, reset_sigma),
                       "expert": (expert_median_s, step_sigma)}
        self.max_s = max_s
        self._rng = random.Random()

    def _wait(self, call: str) -> None:
        median, sigma = self.delays[call]
        if median > 0:
            time.sleep(min(self.max_s, self._rng.lognormvariate(math.log(median), sigma)))

    def reset(self, task_id: str) -> Observation:
        self._wait("reset")
        return self.inner.reset(task_id)

    def step(self, action: str | None) -> StepResult:
        self._wait("step")
        return self.inner.step(action)

    def split_tasks(self, split: str) -> list[str]:
        return self.inner.split_tasks(split)

    def task_type(self, task_id: str) -> str:
        return self.inner.task_type(task_id)

    def expert_action(self) -> tuple[str, str]:
        self._wait("expert")
        return self.inner.expert_action()

    def close(self) -> None:
        self.inner.close()
