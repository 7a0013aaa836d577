"""A pool of environments, stepped many at once, in worker processes or in-process.

With `workers >= slots` every environment has its own process; with fewer, slot i lives in
worker i % workers. A call sends every worker its share of the requests before reading any
answer, so the workers step their environments concurrently.

Faults: a worker that dies, or does not answer within the time limit, is killed and replaced;
the slots it held answer `None` (their episodes are aborted) and the call completes. An
exception raised by an environment itself (a missing game, a bad task id) is not a fault: it
is raised in the caller with the worker's traceback.
"""

from __future__ import annotations

import multiprocessing as mp
import signal
import time
import traceback

from agentrl.envs import make_env
from agentrl.envs.base import Observation, StepResult


class WorkerEnvError(RuntimeError):
    """An environment raised inside a worker; the message holds its traceback."""


def _apply(envs: dict, env_config, command: str, requests: dict) -> dict:
    """Run one command for each slot of `requests` on `envs` (creating a slot's env at its first reset)."""
    answers = {}
    for slot, arg in requests.items():
        if command == "reset" and slot not in envs:
            envs[slot] = make_env(env_config)
        answers[slot] = envs[slot].reset(arg) if command == "reset" else envs[slot].step(arg)
    return answers


def _serve(conn, env_config) -> None:
    # Ctrl-C reaches the whole process group; the parent shuts the workers down in order.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    envs = {}
    while True:
        command, requests = conn.recv()
        if command == "close":
            for env in envs.values():
                env.close()
            conn.close()
            return
        try:
            conn.send(("ok", _apply(envs, env_config, command, requests)))
        except Exception:
            conn.send(("error", traceback.format_exc()))


class EnvPool:
    def __init__(self, env_config, workers: int = 0, step_timeout_s: float = 60.0,
                 reset_timeout_s: float = 300.0):
        self.config = env_config
        self.local = make_env(env_config)
        """In-process instance: task lists, task types, and the environments when workers=0."""
        self.workers = workers
        self.timeouts = {"reset": reset_timeout_s, "step": step_timeout_s}
        self.faults = 0
        """Workers replaced so far (crashed or hung)."""
        self._envs: dict[int, object] = {}
        self._ctx = mp.get_context("spawn")
        self._conns: list = [None] * workers
        self._procs: list = [None] * workers
        for worker in range(workers):
            self._start(worker)

    def _start(self, worker: int) -> None:
        parent, child = self._ctx.Pipe()
        proc = self._ctx.Process(target=_serve, args=(child, self.config), daemon=True)
        proc.start()
        child.close()
        self._conns[worker], self._procs[worker] = parent, proc

    def _replace(self, worker: int) -> None:
        self.faults += 1
        proc = self._procs[worker]
        if proc.is_alive():
            proc.kill()
        proc.join(timeout=10)
        self._conns[worker].close()
        self._start(worker)

    @property
    def max_steps(self) -> int:
        return self.local.max_steps

    def _call(self, command: str, requests: dict) -> dict:
        if self.workers == 0:
            return _apply(self._envs, self.config, command, requests)
        shares: dict[int, dict] = {}
        for slot, arg in requests.items():
            shares.setdefault(slot % self.workers, {})[slot] = arg
        failed = set()
        for worker, share in shares.items():
            try:
                self._conns[worker].send((command, share))
            except (BrokenPipeError, OSError):
                failed.add(worker)
        deadline = time.monotonic() + self.timeouts[command]
        answers, errors = {}, []
        for worker, share in shares.items():
            conn = self._conns[worker]
            try:
                if worker in failed or not conn.poll(max(0.0, deadline - time.monotonic())):
                    raise TimeoutError
                status, payload = conn.recv()
            except (EOFError, OSError, TimeoutError):
                self._replace(worker)
                answers.update({slot: None for slot in share})
                continue
            if status == "error":
                errors.append(payload)
            else:
                answers.update(payload)
        if errors:
            raise WorkerEnvError(f"an environment failed in a worker:\n{errors[0]}")
        return answers

    def reset(self, tasks: dict[int, str]) -> dict[int, Observation | None]:
        """First observations; None for a slot whose worker failed (the episode is aborted)."""
        return self._call("reset", tasks)

    def step(self, actions: dict[int, str | None]) -> dict[int, StepResult | None]:
        """Step results; None for a slot whose worker failed (the episode is aborted)."""
        return self._call("step", actions)

    def close(self) -> None:
        if self.local is None:
            return
        for conn in self._conns:
            try:
                conn.send(("close", None))
            except (BrokenPipeError, OSError):
                pass
        for proc in self._procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()
                proc.join()
        for env in [self.local, *self._envs.values()]:
            env.close()
        self._conns, self._procs, self._envs, self.workers, self.local = [], [], {}, 0, None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
