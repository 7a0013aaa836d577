"""A pool of environments, stepped many at once, in worker processes or in-process.

Slot i lives in worker i % workers; a call sends every worker its share of the requests before
reading any answer, so the workers step their environments concurrently.
"""

from __future__ import annotations

import multiprocessing as mp

from agentrl.envs import make_env
from agentrl.envs.base import Observation, StepResult


def _serve(conn, env_config) -> None:
    envs = {}
    while True:
        command, requests = conn.recv()
        if command == "close":
            for env in envs.values():
                env.close()
            conn.close()
            return
        answers = {}
        for slot, arg in requests.items():
            if command == "reset":
                if slot not in envs:
                    envs[slot] = make_env(env_config)
                answers[slot] = envs[slot].reset(arg)
            else:
                answers[slot] = envs[slot].step(arg)
        conn.send(answers)


class EnvPool:
    def __init__(self, env_config, workers: int = 0):
        self.config = env_config
        self.local = make_env(env_config)
        """In-process instance: task lists, task types, and the environments when workers=0."""
        self.workers = workers
        self._envs: dict[int, object] = {}
        self._conns = []
        self._procs = []
        ctx = mp.get_context("spawn")
        for _ in range(workers):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_serve, args=(child, env_config), daemon=True)
            proc.start()
            self._conns.append(parent)
            self._procs.append(proc)

    @property
    def max_steps(self) -> int:
        return self.local.max_steps

    def _call(self, command: str, requests: dict) -> dict:
        if self.workers == 0:
            answers = {}
            for slot, arg in requests.items():
                if command == "reset":
                    if slot not in self._envs:
                        self._envs[slot] = make_env(self.config)
                    answers[slot] = self._envs[slot].reset(arg)
                else:
                    answers[slot] = self._envs[slot].step(arg)
            return answers
        shares: dict[int, dict] = {}
        for slot, arg in requests.items():
            shares.setdefault(slot % self.workers, {})[slot] = arg
        for worker, share in shares.items():
            self._conns[worker].send((command, share))
        answers = {}
        for worker in shares:
            answers.update(self._conns[worker].recv())
        return answers

    def reset(self, tasks: dict[int, str]) -> dict[int, Observation]:
        return self._call("reset", tasks)

    def step(self, actions: dict[int, str | None]) -> dict[int, StepResult]:
        return self._call("step", actions)

    def close(self) -> None:
        for conn in self._conns:
            try:
                conn.send(("close", None))
            except (BrokenPipeError, OSError):
                pass
        for proc in self._procs:
            proc.join(timeout=5)
            if proc.is_alive():
                proc.kill()
        self._conns, self._procs = [], []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
