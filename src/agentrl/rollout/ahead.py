"""Generation and training overlapped (`rl.overlap`): the sampler in a process of its own plays the
next steps' episodes while the trainer updates on this step's.

The trainer pushes its weights after every update, tagged with their version (the number of
updates behind them), and asks for step t + 1 + k right after pushing version t, so that step s is
played by version s - 1 - k or a later one (k: `rl.overlap.staleness`). The sampler process plays
the requests in order with whatever weights it last received and answers each with the version and
a fingerprint of the weights it actually held. The trainer refuses a step whose samples are older
than k updates, or whose weights are not the version they claim (a push that was lost), so both
faults stop the run instead of training on what nobody asked for.

Messages between the two processes are Python objects on `multiprocessing` queues (the weights as
shared-memory tensors): both ends are this code, nothing is read from outside.
"""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import queue
import signal
import sys
import time

import torch

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
    """The trainer's end: starts the sampler process, pushes weights, asks for steps, takes them."""

    def __init__(self, config, model_path: str):
        self.rl = config.rl
        self.k = self.rl.overlap.staleness
        threads = self.rl.overlap.sampler_threads or torch.get_num_threads()
        context = multiprocessing.get_context("spawn")
        self.requests, self.results = context.Queue(), context.Queue()
        self.fingerprints: dict[int, str] = {}
        self.process = context.Process(
            target=serve, name="agentrl-sampler",
            args=(config.model_dump(mode="json"), model_path, threads, self.requests, self.results, os.getpid()))
        self.process.start()

    def start(self, last_step: int, weights, hint) -> None:
        """The sampler takes version `last_step` and plays the steps after it up to k + 1 ahead;
        `hint(step)`: what the components add to that step's prompts."""
        self.push(last_step, weights)
        for step in range(last_step + 1, min(last_step + 1 + self.k, self.rl.steps) + 1):
            self.requests.put(("play", step, hint(step)))

    def push(self, version: int, weights) -> None:
        """Weights after `version` updates, to sample every step asked for from now on."""
        copy = {name: tensor.detach().to("cpu", copy=True) for name, tensor in weights}  # shared memory on its way
        self.fingerprints[version] = fingerprint(copy.items())
        self.requests.put(("weights", version, copy))

    def after_update(self, step: int, weights, hint) -> None:
        """Update `step` is done: its weights pushed, step + 1 + k asked for."""
        self.push(step, weights)
        if step + 1 + self.k <= self.rl.steps:
            self.requests.put(("play", step + 1 + self.k, hint(step + 1 + self.k)))
        for old in [v for v in self.fingerprints if v < step - self.k]:
            del self.fingerprints[old]

    def take(self, step: int, timing: dict) -> tuple[list, int]:
        """Step `step`'s trajectories and task draws, once the sampler has played them; the
        sampler's timings join `timing` (its idle time before the step as `sampler_idle`, the
        trainer's wait as `wait_rollouts`)."""
        started = time.perf_counter()
        while True:
            try:
                message = self.results.get(timeout=POLL_S)
                break
            except queue.Empty:
                if not self.process.is_alive():
                    raise RunError(f"the sampler process (rl.overlap) died with exit code {self.process.exitcode} "
                                   f"before playing RL step {step}") from None
        timing["wait_rollouts"] = time.perf_counter() - started
        if message[0] == "error":
            raise RunError(f"the sampler process (rl.overlap), RL step {step}: {message[1]}")
        _, played, version, held, trajectories, draws, sampler_timing = message
        if played != step:
            raise RunError(f"the sampler process played RL step {played} where step {step} was due")
        if not 0 <= step - 1 - version <= self.k:
            raise RunError(f"RL step {step} was sampled by the weights of update {version}, more than "
                           f"rl.overlap.staleness = {self.k} updates behind")
        if self.fingerprints.get(version) != held:
            raise RunError(f"RL step {step} was sampled by weights that are not those of update {version}: "
                           f"a weight push did not arrive")
        for key, seconds in sampler_timing.items():
            timing[key] = timing.get(key, 0.0) + seconds
        return trajectories, draws

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
    """The sampler process: its own policy copy, sampler and environment pool, on `threads` torch
    threads; plays the steps it is asked for with the weights it last received. Ctrl-C is the
    trainer's to handle (it stops this process); it leaves by itself when the trainer is gone."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # the pool's workers closed on the way out
    from agentrl.envs.pool import EnvPool
    from agentrl.models import load_tokenizer
    from agentrl.recipe import validate_config
    from agentrl.registry import SAMPLERS
    from agentrl.models import load_policy
    from agentrl.rollout.collect import play_step

    config = validate_config(config_data)
    overlap = config.rl.overlap
    torch.set_num_threads(threads)
    if overlap.sampler_gpu is not None:
        os.environ["LOCAL_RANK"] = str(overlap.sampler_gpu)  # the device `agentrl.distributed.device` gives
    pool = None
    try:
        tokenizer = load_tokenizer(model_path)
        model = load_policy(config, model_path)
        sampler = SAMPLERS.get(config.rl.sampler.type)(config.rl.sampler, model_path, lambda: model, tokenizer, config)
        pool = EnvPool(config.rl_env(), config.rl.env_pool)
        version, idle = None, 0.0
        while True:
            waited = time.perf_counter()
            message = _next(requests, parent)
            idle += time.perf_counter() - waited
            if message is None or message[0] == "stop":
                return
            if message[0] == "weights":
                _, version, weights = message
                sampler.sleep()
                sampler.update_weights(weights.items())
                continue
            _, step, hint = message
            timing = {"sampler_idle": idle}
            trajectories, draws = play_step(pool, sampler, tokenizer, config, step, hint, timing=timing)
            for t in trajectories:
                t.version = version
            results.put(("played", step, version, fingerprint(model.named_parameters()), trajectories, draws, timing))
            idle = 0.0
    except Exception as err:  # the trainer raises it as the step's error
        results.put(("error", f"{type(err).__name__}: {err}"))
    finally:
        if pool is not None:
            pool.close()


def _next(requests, parent: int):
    """The next request, or None once the trainer process is gone."""
    while True:
        try:
            return requests.get(timeout=POLL_S)
        except queue.Empty:
            if os.getppid() != parent:
                return None
