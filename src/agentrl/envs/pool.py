"""A pool of environments, stepped many at once: in worker processes, in Ray actors, or in-process.

With `workers >= slots` every environment has its own worker; with fewer, slot i lives in worker
i % workers. Requests are asynchronous: `submit` hands each worker its share and returns, and
`receive` returns the answers that have arrived, so an episode can move on as soon as its own
environment answers (`reset` / `step` submit and wait for every answer: the lock-step calls).
A worker answers its messages in order, a message's slots together.

Backends: `process` (spawned local processes, one pipe each) and `ray` (one Ray actor per worker,
placed anywhere on a Ray cluster with the resources `rl.env_pool.ray` asks for).

Faults: a worker that dies, or does not answer within the time limit (counted from when it started
on the message), is killed and replaced; the slots of its unanswered messages answer `None` (their
episodes are aborted) and everything else goes on. A process worker found dead before a call (it
died while idle) is replaced before it is given work: before a reset no episode is charged for it;
before a step its episodes in flight are aborted (Ray reports an actor's death at its next call,
which then answers `None`). A worker that dies before ever answering `START_FAILURES` times in a
row stops the run (`RunError`): it cannot start, typically because it imports a script that trains
without the `if __name__ == "__main__":` guard. An exception raised by an environment itself (a
missing game, a bad task id) is not a fault: it is raised in the caller with the worker's
traceback. `faults` keeps a line per fault, for the error that stops a run.
"""

from __future__ import annotations

import multiprocessing as mp
import multiprocessing.connection
import os
import signal
import time
import traceback
from collections import deque
from contextlib import contextmanager
from multiprocessing import resource_tracker

from agentrl.config import ConfigError, EnvPoolConfig
from agentrl.envs import make_env
from agentrl.envs.base import NoExpertMove, Observation, Rejected, StepResult
from agentrl import raycluster
from agentrl.errors import RunError

START_FAILURES = 3
TIME_LIMITS = {"reset": "reset_timeout_s", "step": "step_timeout_s", "try": "step_timeout_s", "expert": "step_timeout_s"}
"""The `rl.env_pool` setting that limits each command's time (per environment of a message)."""
MAIN_GUARD_HINT = ("environment workers are spawned processes that import the main script again: a script that "
                   "trains must do so under `if __name__ == \"__main__\":`; the worker's own error, if any, is "
                   "printed above")


@contextmanager
def ctrl_c_held():
    """Ctrl-C (SIGINT) held back in this thread while it starts worker processes. They inherit the
    hold, so a Ctrl-C pressed while they import (seconds, before `ignore_ctrl_c`) is not theirs to
    answer with a traceback; this process gets it when the hold ends."""
    resource_tracker.ensure_running()  # first: its own start lifts any hold on Ctrl-C (CPython's)
    held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)


def ignore_ctrl_c() -> None:
    """In a worker process: Ctrl-C reaches the whole process group and the parent shuts its workers
    down in order, so the worker ignores it: one held since its start is dropped, and its own
    children (a JVM, an inference engine) inherit the ignoring, not the hold."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


class WorkerEnvError(RuntimeError):
    """An environment raised inside a worker; the message holds its traceback."""


class EnvServer:
    """A worker's environments, one per slot it holds (created at the slot's first reset)."""

    def __init__(self, env_config):
        self.config, self.envs = env_config, {}

    def apply(self, command: str, requests: dict) -> dict:
        answers = {}
        for slot, arg in requests.items():
            if command == "reset" and slot not in self.envs:
                self.envs[slot] = make_env(self.config)
            env = self.envs[slot]
            answers[slot] = (env.reset(arg) if command == "reset" else env.step(arg) if command == "step"
                             else try_step(env, arg) if command == "try" else expert_move(env))
        return answers

    def call(self, command: str, requests: dict) -> tuple[str, object]:
        """("ok", answers) or ("error", the environment's traceback)."""
        try:
            return "ok", self.apply(command, requests)
        except Exception:
            return "error", traceback.format_exc()

    def close(self) -> None:
        for env in self.envs.values():
            env.close()
        self.envs = {}


def try_step(env, action: str | None) -> StepResult | Rejected:
    """The environment's `try_step` where it has one, else its `step` (every move is taken)."""
    return env.try_step(action) if hasattr(env, "try_step") else env.step(action)


def expert_move(env) -> tuple[str, str] | None:
    """The environment's expert's (thought, action) from the current state; None when it has none."""
    try:
        return env.expert_action()
    except NoExpertMove:
        return None


def _serve(conn, env_config) -> None:
    ignore_ctrl_c()
    server = EnvServer(env_config)
    try:
        while (message := conn.recv())[0] != "close":
            conn.send(server.call(*message))
    except (EOFError, BrokenPipeError):  # the parent was killed before it could say close
        pass
    server.close()
    conn.close()


class ProcessWorkers:
    """Workers as spawned local processes, a pipe each."""

    def __init__(self, env_config, workers: int):
        self.config = env_config
        self._ctx = mp.get_context("spawn")
        self.conns: list = [None] * workers
        self.procs: list = [None] * workers
        for worker in range(workers):
            self.start(worker)

    def start(self, worker: int) -> None:
        parent, child = self._ctx.Pipe()
        proc = self._ctx.Process(target=_serve, args=(child, self.config), daemon=True)
        with ctrl_c_held():
            proc.start()
        child.close()
        self.conns[worker], self.procs[worker] = parent, proc

    def dead(self, worker: int) -> str | None:
        """Why the worker is known to be dead ("exit code N"), or None."""
        proc = self.procs[worker]
        return None if proc.is_alive() else f"exit code {proc.exitcode}"

    def send(self, worker: int, message: tuple) -> bool:
        try:
            self.conns[worker].send(message)
            return True
        except (BrokenPipeError, OSError):
            return False

    def wait(self, workers: list[int], timeout: float) -> list[int]:
        """The workers among `workers` with an answer (or a death) to read, within `timeout` s."""
        ready = set(mp.connection.wait([self.conns[w] for w in workers], timeout))
        return [w for w in workers if self.conns[w] in ready]

    def recv(self, worker: int) -> tuple | None:
        """The worker's next answer; None when it died."""
        try:
            return self.conns[worker].recv()
        except (EOFError, OSError):
            self.procs[worker].join(timeout=5)
            return None

    def kill(self, worker: int) -> None:
        proc = self.procs[worker]
        if proc.is_alive():
            proc.kill()
        proc.join(timeout=10)
        self.conns[worker].close()

    def close(self) -> None:
        for worker in range(len(self.procs)):
            self.send(worker, ("close", None))
        for proc in self.procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()
                proc.join()


class RayWorkers:
    """Workers as Ray actors on the cluster `raycluster.join` gives (the config's address,
    RAY_ADDRESS, or a local cluster shut down again at close)."""

    def __init__(self, env_config, workers: int, cfg):
        self.ray, self.owns_cluster = raycluster.join("rl.env_pool", cfg.ray.address)
        self.config = env_config
        have = self.ray.cluster_resources().get("CPU", 0)
        if cfg.ray.address is None and not os.environ.get("RAY_ADDRESS") and have < workers * cfg.ray.num_cpus:
            self.close()
            raise ConfigError(f"rl.env_pool.ray.num_cpus: {workers} workers x {cfg.ray.num_cpus:g} CPUs do not fit "
                              f"the local Ray cluster's {have:g} CPUs (lower num_cpus, or give ray.address)")
        memory = int(cfg.ray.memory_gib * 2**30) if cfg.ray.memory_gib else None
        self.actor_class = self.ray.remote(num_cpus=cfg.ray.num_cpus, memory=memory, max_restarts=0)(EnvServer)
        self.actors: list = [None] * workers
        self.pending: list[deque] = [deque() for _ in range(workers)]
        for worker in range(workers):
            self.start(worker)

    def start(self, worker: int) -> None:
        self.actors[worker] = self.actor_class.remote(self.config)
        self.pending[worker].clear()

    def dead(self, worker: int) -> str | None:
        return None  # Ray reports a death at the next call

    def send(self, worker: int, message: tuple) -> bool:
        self.pending[worker].append(self.actors[worker].call.remote(*message))
        return True

    def wait(self, workers: list[int], timeout: float) -> list[int]:
        heads = {self.pending[w][0]: w for w in workers}
        ready, rest = self.ray.wait(list(heads), num_returns=1, timeout=timeout, fetch_local=False)
        if ready and rest:
            ready += self.ray.wait(rest, num_returns=len(rest), timeout=0, fetch_local=False)[0]
        return [heads[ref] for ref in ready]

    def recv(self, worker: int) -> tuple | None:
        try:
            return self.ray.get(self.pending[worker].popleft())
        except self.ray.exceptions.RayActorError:
            return None

    def kill(self, worker: int) -> None:
        self.ray.kill(self.actors[worker], no_restart=True)
        self.pending[worker].clear()

    def close(self) -> None:
        closing = [actor.close.remote() for actor in getattr(self, "actors", []) if actor is not None]
        try:
            self.ray.get(closing, timeout=30)
        except self.ray.exceptions.RayError:
            pass
        for actor in getattr(self, "actors", []):
            if actor is not None:
                self.ray.kill(actor, no_restart=True)
        if self.owns_cluster:
            self.ray.shutdown()


class EnvPool:
    def __init__(self, env_config, pool: EnvPoolConfig | None = None):
        pool = pool or EnvPoolConfig()
        self.config = env_config
        self.local = make_env(env_config)
        """In-process instance: task lists, task types, and the environments when workers=0."""
        self.workers = pool.workers
        self.timeouts = {command: getattr(pool, setting) for command, setting in TIME_LIMITS.items()}
        self.faults: list[str] = []
        """One line per worker replaced so far (crashed, hung, or died while idle)."""
        self._server = EnvServer(env_config) if not pool.workers else None
        self.transport = None
        if pool.workers:
            self.transport = (RayWorkers(env_config, pool.workers, pool) if pool.backend == "ray"
                              else ProcessWorkers(env_config, pool.workers))
        self._queue: list[deque] = [deque() for _ in range(pool.workers)]  # per worker: (command, slots) sent
        self._started = [0.0] * pool.workers  # when the worker started on the head of its queue
        self._answered = [False] * pool.workers  # whether the worker's current incarnation has answered
        self._start_failures = [0] * pool.workers  # its incarnations in a row that died before answering
        self._arrived: dict[int, object] = {}  # answers not yet received by the caller

    @property
    def max_steps(self) -> int:
        return self.local.max_steps

    @property
    def pending(self) -> int:
        """Slots submitted and not yet received."""
        return len(self._arrived) + sum(len(slots) for queue in self._queue for _, slots in queue)

    def fault_summary(self, last: int = 3) -> str:
        """The most recent faults, for an error message."""
        if not self.faults:
            return "no worker fault was seen"
        shown = "; ".join(self.faults[-last:])
        hint = f". Workers exited before their first answer: {MAIN_GUARD_HINT}" if any(self._start_failures) else ""
        return f"{len(self.faults)} worker faults, the last: {shown}{hint}"

    # --- asynchronous requests ---------------------------------------------------------------------
    def submit(self, command: str, requests: dict) -> None:
        """Send `command` ("reset": task ids, "step" or "try": actions, "expert": None) for each slot of `requests`; the
        answers come from `receive`. In-process (workers=0) the environments run here and now."""
        if self.transport is None:
            status, payload = self._server.call(command, requests)
            if status == "error":
                raise WorkerEnvError(f"an environment failed:\n{payload}")
            self._arrived.update(payload)
            return
        shares: dict[int, dict] = {}
        for slot, arg in requests.items():
            shares.setdefault(slot % self.workers, {})[slot] = arg
        for worker, share in shares.items():
            died = self.transport.dead(worker) if not self._queue[worker] else None
            if died:  # it died while idle: replaced before it gets work
                self._replace(worker, f"exited while idle ({died})")
                if command != "reset":  # its episodes in flight died with it
                    self._arrived.update({slot: None for slot in share})
                    continue
            if not self._queue[worker]:
                self._started[worker] = time.monotonic()
            self._queue[worker].append((command, list(share)))
            if not self.transport.send(worker, (command, share)):
                self._fail(worker, f"exited during a {command} (its pipe is closed)")

    def receive(self, timeout: float | None = None) -> dict[int, object]:
        """The answers that have arrived (None for a slot whose worker failed), waiting up to
        `timeout` seconds for the first (None: until one arrives); {} when nothing is pending."""
        wait_until = None if timeout is None else time.monotonic() + timeout
        while True:
            answers, self._arrived = self._arrived, {}
            busy = [w for w, queue in enumerate(self._queue) if queue]
            if answers or not busy:
                return answers
            until = min([self._deadline(w) for w in busy] + ([wait_until] if wait_until is not None else []))
            errors = []
            for worker in self.transport.wait(busy, max(0.0, until - time.monotonic())):
                command, slots = self._queue[worker][0]
                message = self.transport.recv(worker)
                if message is None:
                    self._fail(worker, f"exited during a {command} ({self.transport.dead(worker) or 'its actor died'})")
                    continue
                self._queue[worker].popleft()
                self._started[worker] = time.monotonic()
                self._answered[worker], self._start_failures[worker] = True, 0
                status, payload = message
                if status == "error":
                    errors.append(payload)
                else:
                    self._arrived.update(payload)
            now = time.monotonic()
            for worker in busy:
                if self._queue[worker] and now >= self._deadline(worker):
                    command, slots = self._queue[worker][0]
                    article = "an" if command == "expert" else "a"
                    self._fail(worker, f"did not answer {article} {command} of {len(slots)} environment(s) within the "
                                       f"time limit (rl.env_pool.{TIME_LIMITS[command]} = {self.timeouts[command]:g} each)")
            if errors:
                raise WorkerEnvError(f"an environment failed in a worker:\n{errors[0]}")
            if wait_until is not None and now >= wait_until and not self._arrived:
                return {}

    def _deadline(self, worker: int) -> float:
        """When the worker's current message times out: the time limit of one reset or step for
        each environment of the message (a worker runs its environments one after another)."""
        command, slots = self._queue[worker][0]
        return self._started[worker] + self.timeouts[command] * len(slots)

    def _fail(self, worker: int, cause: str) -> None:
        """The worker is lost: every slot it still owed answers None, and it is replaced."""
        for _, slots in self._queue[worker]:
            self._arrived.update({slot: None for slot in slots})
        self._queue[worker].clear()
        self._replace(worker, cause)

    def _replace(self, worker: int, cause: str) -> None:
        self.transport.kill(worker)
        self.faults.append(f"worker {worker} {cause}")
        if cause.startswith("exited") and not self._answered[worker]:
            self._start_failures[worker] += 1
            if self._start_failures[worker] >= START_FAILURES:
                raise RunError(f"environment worker {worker} exited before answering {START_FAILURES} times in a "
                               f"row (last: {cause}): {MAIN_GUARD_HINT}")
        self._answered[worker] = False
        self.transport.start(worker)

    # --- lock-step calls -----------------------------------------------------------------------
    def _call(self, command: str, requests: dict, *more: tuple[str, dict]) -> dict:
        """Every answer to `command` on `requests` (and to each further (command, requests))."""
        expected = 0
        for each, each_requests in ((command, requests), *more):
            if each_requests:
                self.submit(each, each_requests)
                expected += len(each_requests)
        answers = {}
        while len(answers) < expected:
            answers.update(self.receive())
        return answers

    def reset(self, tasks: dict[int, str]) -> dict[int, Observation | None]:
        """First observations; None for a slot whose worker failed (the episode is aborted)."""
        return self._call("reset", tasks)

    def step(self, actions: dict[int, str | None], tentative: frozenset[int] = frozenset()
             ) -> dict[int, StepResult | Rejected | None]:
        """Step results; None for a slot whose worker failed (the episode is aborted). The slots in
        `tentative` are tried (`try_step`): their answer may be `Rejected`."""
        tried = {slot: a for slot, a in actions.items() if slot in tentative}
        return self._call("step", {slot: a for slot, a in actions.items() if slot not in tentative}, ("try", tried))

    def expert(self, slots: list[int]) -> dict[int, tuple[str, str] | None]:
        """The expert's (thought, action) in each slot's current state (DAgger's labels); None
        where it has no move or the slot's worker failed."""
        return self._call("expert", dict.fromkeys(slots))

    def close(self) -> None:
        if self.local is None:
            return
        if self.transport is not None:
            self.transport.close()
        if self._server is not None:
            self._server.close()
        self.local.close()
        self.transport, self._server, self.workers, self.local = None, None, 0, None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
