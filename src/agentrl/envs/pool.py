"""A pool of environments, stepped many at once, in worker processes or in-process.

With `workers >= slots` every environment has its own process; with fewer, slot i lives in
worker i % workers. A call sends every worker its share of the requests before reading any
answer, so the workers step their environments concurrently.

Faults: a worker that dies, or does not answer within the time limit, is killed and replaced;
the slots it held answer `None` (their episodes are aborted) and the call completes. A worker
found dead before a call (it died while idle) is replaced before it is given work: before a
reset no episode is charged for it; before a step its episodes in flight are aborted. A worker
that dies before ever answering `START_FAILURES` times in a row stops the run (`RunError`): it
cannot start, typically because it imports a script that trains without the
`if __name__ == "__main__":` guard. An exception raised by an environment
itself (a missing game, a bad task id) is not a fault: it is raised in the caller with the
worker's traceback. `faults` keeps a line per fault, for the error that stops a run.
"""

from __future__ import annotations

import multiprocessing as mp
import signal
import time
import traceback

from agentrl.envs import make_env
from agentrl.envs.base import Observation, StepResult
from agentrl.errors import RunError

START_FAILURES = 3
MAIN_GUARD_HINT = ("environment workers are spawned processes that import the main script again: a script that "
                   "trains must do so under `if __name__ == \"__main__\":`; the worker's own error, if any, is "
                   "printed above")


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
        self.faults: list[str] = []
        """One line per worker replaced so far (crashed, hung, or died while idle)."""
        self._envs: dict[int, object] = {}
        self._ctx = mp.get_context("spawn")
        self._conns: list = [None] * workers
        self._procs: list = [None] * workers
        self._answered = [False] * workers  # whether the worker's current process has answered
        self._start_failures = [0] * workers  # its processes in a row that exited before answering
        for worker in range(workers):
            self._start(worker)

    def _start(self, worker: int) -> None:
        parent, child = self._ctx.Pipe()
        proc = self._ctx.Process(target=_serve, args=(child, self.config), daemon=True)
        proc.start()
        child.close()
        self._conns[worker], self._procs[worker], self._answered[worker] = parent, proc, False

    def _replace(self, worker: int, cause: str) -> None:
        proc = self._procs[worker]
        if proc.is_alive():
            proc.kill()
        proc.join(timeout=10)
        self._conns[worker].close()
        self.faults.append(f"worker {worker} {cause}")
        if cause.startswith("exited") and not self._answered[worker]:
            self._start_failures[worker] += 1
            if self._start_failures[worker] >= START_FAILURES:
                raise RunError(f"environment worker {worker} exited before answering {START_FAILURES} times in a "
                               f"row (last: {cause}): {MAIN_GUARD_HINT}")
        self._start(worker)

    def fault_summary(self, last: int = 3) -> str:
        """The most recent faults, for an error message."""
        if not self.faults:
            return "no worker fault was seen"
        shown = "; ".join(self.faults[-last:])
        hint = f". Workers exited before their first answer: {MAIN_GUARD_HINT}" if any(self._start_failures) else ""
        return f"{len(self.faults)} worker faults, the last: {shown}{hint}"

    @property
    def max_steps(self) -> int:
        return self.local.max_steps

    def _call(self, command: str, requests: dict) -> dict:
        if self.workers == 0:
            return _apply(self._envs, self.config, command, requests)
        shares: dict[int, dict] = {}
        for slot, arg in requests.items():
            shares.setdefault(slot % self.workers, {})[slot] = arg
        answers, errors = {}, []
        for worker in list(shares):  # one that died while idle is replaced before it gets work
            if not self._procs[worker].is_alive():
                self._replace(worker, f"exited while idle (exit code {self._procs[worker].exitcode})")
                if command == "step":  # its episodes in flight died with it
                    answers.update({slot: None for slot in shares.pop(worker)})
        failed = set()
        for worker, share in shares.items():
            try:
                self._conns[worker].send((command, share))
            except (BrokenPipeError, OSError):
                failed.add(worker)
        deadline = time.monotonic() + self.timeouts[command]
        for worker, share in shares.items():
            conn, died, cause = self._conns[worker], worker in failed, None
            if not died and not conn.poll(max(0.0, deadline - time.monotonic())):
                cause = (f"did not answer a {command} within the time limit "
                         f"(rl.env_{command}_timeout_s = {self.timeouts[command]:g})")
            elif not died:
                try:
                    status, payload = conn.recv()
                except (EOFError, OSError):
                    died = True
            if died:
                self._procs[worker].join(timeout=5)
                cause = f"exited during a {command} (exit code {self._procs[worker].exitcode})"
            if cause is not None:
                self._replace(worker, cause)
                answers.update({slot: None for slot in share})
                continue
            self._answered[worker], self._start_failures[worker] = True, 0
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
