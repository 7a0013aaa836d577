"""Generation and training overlapped (`rl.overlap`): the sampler in a process of its own plays the
next steps' episodes while the trainer updates on this step's.

The trainer pushes its weights after every update, tagged with their version (the number of
updates behind them), and asks for step t + 1 + k right after pushing version t, so that step s is
played by version s - 1 - k or a later one (k: `rl.overlap.staleness`). The sampler process plays
the requests in order with whatever weights it last received and answers each with the version and
a fingerprint of the weights it actually held. The trainer refuses a step whose samples are older
than k updates, or whose weights are not the version they claim (a push that was lost), so both
faults stop the run instead of training on what nobody asked for.

The sampler runs as a local process (`rl.overlap.backend: process`; messages are Python objects on
`multiprocessing` queues, the weights shared-memory tensors) or as a Ray actor anywhere on a Ray
cluster (`backend: ray`; each message an actor call, the weights in Ray's object store). Either
way it is the same `SamplerSide` taking the same messages in the order sent: both ends are this
code, nothing is read from outside.
"""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import queue
import signal
import sys
import time
from collections import deque

import torch

from agentrl import raycluster
from agentrl.envs.pool import ctrl_c_held, ignore_ctrl_c
from agentrl.errors import RunError

POLL_S = 1.0
"""How often a waiting side checks that the other is still alive."""


def fingerprint(weights) -> str:
    """A digest of (name, tensor) pairs: each tensor's bytes at up to 4,096 evenly spaced elements
    (an update moves nearly every weight; exact bytes, so the thread count cannot change it)."""
    digest = hashlib.blake2b(digest_size=16)
    for name, tensor in sorted(weights, key=lambda pair: pair[0]):
        flat = tensor.detach().reshape(-1)
        picked = flat[::max(1, flat.numel() // 4096)].contiguous().cpu()
        digest.update(name.encode())
        digest.update(picked.view(torch.uint8).numpy().tobytes() if picked.numel() else b"")
    return digest.hexdigest()


class Ahead:
    """The trainer's end: starts the sampler, pushes weights, asks for steps, takes them."""

    def __init__(self, config, model_path: str):
        self.rl = config.rl
        self.k = self.rl.overlap.staleness
        threads = self.rl.overlap.sampler_threads or torch.get_num_threads()
        link = RayLink if self.rl.overlap.backend == "ray" else ProcessLink
        self.link = link(config, model_path, threads)
        self.fingerprints: dict[int, str] = {}

    def start(self, last_step: int, weights, hint) -> None:
        """The sampler takes version `last_step` and plays the steps after it up to k + 1 ahead;
        `hint(step)`: what the components add to that step's prompts."""
        self.push(last_step, weights)
        for step in range(last_step + 1, min(last_step + 1 + self.k, self.rl.steps) + 1):
            self.link.send(("play", step, hint(step)))

    def push(self, version: int, weights) -> None:
        """Weights after `version` updates, to sample every step asked for from now on."""
        copy = {name: tensor.detach().to("cpu", copy=True) for name, tensor in weights}  # shared memory on its way
        self.fingerprints[version] = fingerprint(copy.items())
        self.link.send(("weights", version, copy))

    def after_update(self, step: int, weights, hint) -> None:
        """Update `step` is done: its weights pushed, step + 1 + k asked for."""
        self.push(step, weights)
        if step + 1 + self.k <= self.rl.steps:
            self.link.send(("play", step + 1 + self.k, hint(step + 1 + self.k)))
        for old in [v for v in self.fingerprints if v < step - self.k]:
            del self.fingerprints[old]

    def take(self, step: int, timing: dict) -> tuple[list, int]:
        """Step `step`'s trajectories and task draws, once the sampler has played them; the
        sampler's timings join `timing` (its idle time before the step as `sampler_idle`, the
        trainer's wait as `wait_rollouts`); `sampler_threads`: the torch threads it played on."""
        started = time.perf_counter()
        message = self.link.receive(step)
        timing["wait_rollouts"] = time.perf_counter() - started
        if message[0] == "error":
            raise RunError(f"the sampler (rl.overlap), RL step {step}: {message[1]}")
        _, played, version, held, trajectories, draws, sampler_timing = message
        if played != step:
            raise RunError(f"the sampler played RL step {played} where step {step} was due")
        if not 0 <= step - 1 - version <= self.k:
            raise RunError(f"RL step {step} was sampled by the weights of update {version}, more than "
                           f"rl.overlap.staleness = {self.k} updates behind")
        if self.fingerprints.get(version) != held:
            raise RunError(f"RL step {step} was sampled by weights that are not those of update {version}: "
                           f"a weight push did not arrive")
        self.sampler_threads = sampler_timing.pop("threads")
        for key, seconds in sampler_timing.items():
            timing[key] = timing.get(key, 0.0) + seconds
        return trajectories, draws

    def close(self) -> None:
        self.link.close()


class SamplerSide:
    """The sampler's end, in a process of its own or a Ray actor: its own policy copy, sampler and
    environment pool, on `threads` torch threads. `handle` takes the trainer's messages in the order
    sent: weights to sample with from now on, and steps to play with the weights last received.
    What fails (here, or when a step is played) is answered to the next step asked for."""

    def __init__(self, config_data: dict, model_path: str, threads: int):
        from agentrl.envs.pool import EnvPool
        from agentrl.models import load_policy, load_tokenizer
        from agentrl.recipe import validate_config
        from agentrl.registry import SAMPLERS

        self.pool, self.failed, self.version, self.idle = None, None, None, 0.0
        try:
            self.config = config = validate_config(config_data)
            torch.set_num_threads(threads)
            if config.rl.overlap.sampler_gpu is not None:
                os.environ["LOCAL_RANK"] = str(config.rl.overlap.sampler_gpu)  # the device `agentrl.distributed.device` gives
            self.tokenizer = load_tokenizer(model_path)
            # HF generates with a policy copy here; vLLM's engine holds its own weights
            self.model = load_policy(config, model_path) if config.rl.sampler.type == "hf" else None
            self.sampler = SAMPLERS.get(config.rl.sampler.type)(config.rl.sampler, model_path, lambda: self.model,
                                                                self.tokenizer, config)
            self.loaded = None
            self.pool = EnvPool(config.rl_env(), config.rl.env_pool)
        except Exception as err:  # the trainer raises it as the first step's error
            self.failed = f"{type(err).__name__}: {err}"
        self.idle_since = time.perf_counter()

    def handle(self, message: tuple) -> tuple | None:
        """('weights', version, weights): None once loaded; ('play', step, hint): the played step
        (or the error that stopped it)."""
        from agentrl.rollout.collect import play_step

        self.idle += time.perf_counter() - self.idle_since
        try:
            if message[0] == "weights":
                if self.failed is None:
                    _, self.version, weights = message
                    self.sampler.sleep()
                    self.sampler.update_weights(weights.items())
                    if self.model is None:
                        self.loaded = fingerprint(weights.items())
                return None
            if self.failed is not None:
                return ("error", self.failed)
            _, step, hint = message
            timing = {"sampler_idle": self.idle, "threads": torch.get_num_threads()}
            try:
                trajectories, draws = play_step(self.pool, self.sampler, self.tokenizer, self.config, step, hint,
                                                timing=timing)
            except Exception as err:
                self.failed = f"{type(err).__name__}: {err}"
                return ("error", self.failed)
            for t in trajectories:
                t.version = self.version
            self.idle = 0.0
            return ("played", step, self.version, self.held(), trajectories, draws, timing)
        finally:
            self.idle_since = time.perf_counter()

    def held(self) -> str:
        """The fingerprint of the weights that sampled: the HF policy copy's own; for an engine
        that holds its weights in its own layout (vLLM), those it last loaded."""
        return fingerprint(self.model.named_parameters()) if self.model is not None else self.loaded

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()
            self.pool = None


class ProcessLink:
    """The sampler in a local process (`serve`), on `multiprocessing` queues."""

    def __init__(self, config, model_path: str, threads: int):
        context = multiprocessing.get_context("spawn")
        self.requests, self.results = context.Queue(), context.Queue()
        self.process = context.Process(
            target=serve, name="agentrl-sampler",
            args=(config.model_dump(mode="json"), model_path, threads, self.requests, self.results, os.getpid()))
        with ctrl_c_held():
            self.process.start()

    def send(self, message: tuple) -> None:
        self.requests.put(message)

    def receive(self, step: int) -> tuple:
        while True:
            try:
                return self.results.get(timeout=POLL_S)
            except queue.Empty:
                if not self.process.is_alive():
                    raise RunError(f"the sampler process (rl.overlap) died with exit code {self.process.exitcode} "
                                   f"before playing RL step {step}") from None

    def close(self) -> None:
        if self.process.is_alive():
            self.requests.put(("stop",))
            self.process.join(timeout=30)
        if self.process.is_alive():
            self.process.terminate()
            self.process.join(timeout=10)
        self.requests.close()
        self.results.close()


def serve(config_data: dict, model_path: str, threads: int, requests, results, parent: int) -> None:
    """The sampler process: a `SamplerSide` answering the requests in order. Ctrl-C is the
    trainer's to handle (it stops this process); it leaves by itself when the trainer is gone."""
    ignore_ctrl_c()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # the pool's workers closed on the way out
    # Leaving never waits to deliver answers no one will read (a step played ahead and never taken:
    # the queue's feeder thread would hold the exit, and the trainer's exit waits for this process).
    results.cancel_join_thread()
    side = SamplerSide(config_data, model_path, threads)
    try:
        while (message := _next(requests, parent)) is not None and message[0] != "stop":
            answer = side.handle(message)
            if answer is not None:
                results.put(answer)
    finally:
        side.close()


def _next(requests, parent: int):
    """The next request, or None once the trainer process is gone."""
    while True:
        try:
            return requests.get(timeout=POLL_S)
        except queue.Empty:
            if os.getppid() != parent:
                return None


class RayLink:
    """The sampler as a Ray actor on the cluster `raycluster.join` gives (`rl.overlap.ray.address`,
    RAY_ADDRESS, or a local cluster shut down again at close). Calls from one caller to an
    actor run in the order made, so the messages keep their order; a dead actor is reported when
    its next answer is due."""

    def __init__(self, config, model_path: str, threads: int):
        cfg = config.rl.overlap.ray
        self.ray, self.owns_cluster = raycluster.join("rl.overlap", cfg.address)
        self.answers = deque()
        actor = self.ray.remote(num_cpus=cfg.num_cpus, num_gpus=cfg.num_gpus, max_restarts=0)(SamplerSide)
        self.actor = actor.remote(config.model_dump(mode="json"), model_path, threads)

    def send(self, message: tuple) -> None:
        answer = self.actor.handle.remote(message)
        if message[0] == "play":
            self.answers.append(answer)

    def receive(self, step: int) -> tuple:
        try:
            return self.ray.get(self.answers.popleft())
        except self.ray.exceptions.RayActorError as err:
            cause = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise RunError(f"the sampler actor (rl.overlap) died before playing RL step {step}: {cause}") from None

    def close(self) -> None:
        try:
            self.ray.get(self.actor.close.remote(), timeout=30)
        except self.ray.exceptions.RayError:
            pass
        self.ray.kill(self.actor, no_restart=True)
        if self.owns_cluster:
            self.ray.shutdown()
