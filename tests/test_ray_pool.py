"""The Ray-backed environment pool on a local Ray cluster started by the test: the same answers
as in-process, real actor deaths and hangs (SIGKILL / SIGSTOP of the actor's process) abort
exactly their own episodes, environment errors arrive with their traceback, and nothing is left
running afterwards."""

import os
import signal
import socket
import time
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

from conftest import processes  # noqa: E402
from test_failures import with_, write  # noqa: E402
from test_pool import play  # noqa: E402
from test_trainer import small_config  # noqa: E402

from agentrl.cli import main  # noqa: E402
from agentrl.config import ConfigError, EnvPoolConfig  # noqa: E402
from agentrl.envs.household.env import HouseholdEnvConfig
from agentrl.envs.latency import LatencyEnvConfig
from agentrl.envs.pool import EnvPool, WorkerEnvError  # noqa: E402
from agentrl.trainer import RLTrainer  # noqa: E402


def ray_processes() -> list[int]:
    """PIDs of Ray's own processes (the cluster's daemons and its workers)."""
    markers = ("raylet", "gcs_server", "ray::", "default_worker.py")
    return processes(lambda cmdline: any(marker in cmdline for marker in markers))


def assert_nothing_left(before: set[int], within_s: float = 30) -> None:
    deadline = time.monotonic() + within_s
    while set(ray_processes()) - before and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not set(ray_processes()) - before, "Ray processes left running"


def actor_pid(pool, worker: int) -> int:
    return ray.get(pool.transport.actors[worker].__ray_call__.remote(lambda self: os.getpid()))


def ray_pool(env, workers, **limits):
    return EnvPool(env, EnvPoolConfig(backend="ray", workers=workers, ray={"num_cpus": 0.25}, **limits))


def test_ray_pool_matches_in_process_and_stops_its_own_cluster():
    before = set(ray_processes())
    with EnvPool(HouseholdEnvConfig()) as local:
        expected = play(local)
    assert not ray.is_initialized()
    with ray_pool(HouseholdEnvConfig(), 2) as pool:  # starts a local cluster: it owns it
        assert pool.transport.owns_cluster
        assert play(pool) == expected
    assert not ray.is_initialized()
    assert_nothing_left(before)


@pytest.fixture
def cluster():
    before = set(ray_processes())
    ray.init(num_cpus=2, include_dashboard=False)
    yield
    ray.shutdown()
    assert_nothing_left(before)


def test_an_actor_killed_or_hung_mid_step_aborts_exactly_its_episodes(cluster):
    env = LatencyEnvConfig(inner={"type": "household"}, step_median_s=1.0, step_sigma=0.0)
    with ray_pool(env, 3, step_timeout_s=3.0) as pool:
        assert not pool.transport.owns_cluster
        observations = pool.reset({slot: f"train-{slot}" for slot in range(4)})  # worker 0 holds slots 0 and 3
        pids = [actor_pid(pool, w) for w in range(3)]
        pool.submit("step", {slot: observations[slot].admissible_actions[0] for slot in range(4)})
        time.sleep(0.3)  # every actor is inside its 1 s step
        os.kill(pids[0], signal.SIGKILL)
        os.kill(pids[1], signal.SIGSTOP)
        answers = {}
        while pool.pending:
            answers.update(pool.receive())
        assert answers[0] is None and answers[3] is None and answers[1] is None and answers[2] is not None
        assert len(pool.faults) == 2
        assert "worker 0 exited during a step" in pool.faults[0]
        assert ("worker 1 did not answer a step of 1 environment(s) within the time limit "
                "(rl.env_pool.step_timeout_s = 3 each)") in pool.faults[1]
        # The replacements serve new episodes.
        assert all(o is not None for o in pool.reset({0: "train-0", 1: "train-1", 3: "train-3"}).values())
        assert actor_pid(pool, 0) != pids[0] and actor_pid(pool, 1) != pids[1]
        with pytest.raises(WorkerEnvError, match="Traceback"):
            pool.reset({2: "no-such-split-7"})
    assert ray.is_initialized()  # the test's own cluster stays up for it to stop


def test_ray_workers_that_do_not_fit_the_local_cluster_are_refused(cluster):
    with pytest.raises(ConfigError, match="rl.env_pool.ray.num_cpus: 3 workers x 1 CPUs do not fit"):
        EnvPool(HouseholdEnvConfig(), EnvPoolConfig(backend="ray", workers=3))
    with pytest.raises(ConfigError, match="1 workers x 3 CPUs do not fit the local Ray cluster's 2 CPUs"):
        EnvPool(HouseholdEnvConfig(), EnvPoolConfig(backend="ray", workers=1, ray={"num_cpus": 3}))


def test_a_refused_pool_stops_the_cluster_it_started():
    before = set(ray_processes())
    with pytest.raises(ConfigError, match="do not fit the local Ray cluster"):
        EnvPool(HouseholdEnvConfig(), EnvPoolConfig(backend="ray", workers=1, ray={"num_cpus": 10**4}))
    assert not ray.is_initialized()
    assert_nothing_left(before)


def test_each_ray_worker_reserves_its_cpus_and_memory(cluster):
    """rl.env_pool.ray.num_cpus and memory_gib are what each worker actor holds of the cluster."""
    free = ray.available_resources()
    settings = EnvPoolConfig(backend="ray", workers=2, ray={"num_cpus": 0.5, "memory_gib": 0.25})
    with EnvPool(HouseholdEnvConfig(), settings) as pool:
        play(pool)
        held = ray.available_resources()
    assert free["CPU"] - held["CPU"] == pytest.approx(2 * 0.5)
    assert free["memory"] - held["memory"] == pytest.approx(2 * 0.25 * 2**30)


def closed_port() -> int:
    """A local port that nothing listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.parametrize("section", ["env_pool", "overlap"])
def test_a_ray_address_nothing_answers_at_exits_2_at_once_naming_it(tmp_path, capsys, monkeypatch, tiny_model_dir,
                                                                    section):
    """Ray alone waits minutes for a cluster that is not there and then raises with a traceback: a
    wrong address (the recipe's or RAY_ADDRESS) is refused at once, with one line naming it."""
    before = set(ray_processes())
    address = f"127.0.0.1:{closed_port()}"
    cases = [(address, None, f"rl.{section}.ray.address: no Ray cluster answers at {address}"),
             (None, address, f"RAY_ADDRESS: no Ray cluster answers at {address}"),
             ("garbage", None, f"rl.{section}.ray.address: 'garbage' is not host:port")]
    for given, ray_address, message in cases:
        settings = {"backend": "ray", "ray": {"address": given}}
        settings.update({"workers": 1} if section == "env_pool" else {"staleness": 1})
        recipe = write(tmp_path / "recipe.yaml", with_(run_dir=str(tmp_path / "run"), **{f"rl__{section}": settings}))
        monkeypatch.setenv("RAY_ADDRESS", ray_address) if ray_address else monkeypatch.delenv("RAY_ADDRESS", False)
        start = time.monotonic()
        assert main(["train", recipe, "--model", str(tiny_model_dir)]) == 2, message
        err = capsys.readouterr().err.strip()
        assert message in err and "Traceback" not in err and len(err.splitlines()) == 1, err
        assert time.monotonic() - start < 60
        assert not ray.is_initialized()
    assert_nothing_left(before)


class KillsActorOnCall:
    """The trainer's real sampler, which SIGKILLs environment actor 0 just before its `at`-th batch."""

    def __init__(self, sampler, pool, at):
        self.sampler, self.pool, self.at, self.calls = sampler, pool, at, 0

    def generate(self, prompts, sampling):
        self.calls += 1
        if self.calls == self.at:
            os.kill(actor_pid(self.pool, 0), signal.SIGKILL)
        return self.sampler.generate(prompts, sampling)

    def update_weights(self, weights):
        self.sampler.update_weights(weights)

    def sleep(self):
        self.sampler.sleep()


@pytest.mark.parametrize("mode", ["lockstep", "async"])
def test_a_training_step_on_ray_actors_survives_a_killed_actor(cluster, tiny_model_dir, tmp_path, mode):
    config = small_config(tmp_path / "run", 1, env_pool={"backend": "ray", "workers": 6, "ray": {"num_cpus": 0.25}},
                          rollout={"mode": mode, "batch_window_s": 0.0})
    with RLTrainer(config, str(tiny_model_dir), Path(config.run_dir)) as trainer:
        trainer.sampler = KillsActorOnCall(trainer.sampler, trainer.pool, at=2)
        metrics = trainer.train_step()
        assert metrics["rollout/aborted"] == 1 and metrics["rollout/dropped_groups"] == 1
        assert len(trainer.pool.faults) == 1
        metrics = trainer.train_step()  # the replacement serves the next step
        assert metrics["rollout/aborted"] == 0


# --- the sampler as a Ray actor (rl.overlap.backend: ray) ------------------------------------------

def test_the_sampler_as_a_ray_actor_trains_what_the_sampler_process_trains_and_leaves_nothing(tiny_model_dir, tmp_path):
    """k = 0: the same `SamplerSide` answering the same messages in the same order, so the run's
    samples, metrics and final weights are the process backend's, bit for bit (both on one torch
    thread); the cluster the run started is stopped after it."""
    import torch
    from safetensors.torch import load_file
    from test_trainer import run, strip_timing

    from agentrl.checkpoint import list_checkpoints
    from agentrl.rollout.records import read_trajectories
    from agentrl.tracking import read_metrics

    before = set(ray_processes())
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for backend in ("process", "ray"):
            overlap = {"staleness": 0, "backend": backend, "ray": {"num_cpus": 0.5}}
            run(small_config(tmp_path / backend, 3, overlap=overlap), tiny_model_dir)
    finally:
        torch.set_num_threads(threads)
    assert not ray.is_initialized()
    assert_nothing_left(before)
    weights = [load_file(list_checkpoints(tmp_path / b)[-1] / "model" / "model.safetensors") for b in ("process", "ray")]
    assert weights[0].keys() == weights[1].keys()
    assert all(torch.equal(weights[0][name], weights[1][name]) for name in weights[0])
    rows = [strip_timing(read_metrics(tmp_path / b / "logs" / "metrics.jsonl")) for b in ("process", "ray")]
    assert rows[0] == rows[1] and len(rows[0]) == 3
    played = [[(t.version, [s.response_ids for s in t.steps]) for path in sorted((tmp_path / b / "rollouts").glob("step_*"))
               for t in read_trajectories(path)] for b in ("process", "ray")]
    assert played[0] == played[1] and {version for version, _ in played[1]} == {0, 1, 2}


def test_a_dead_sampler_actor_stops_the_run_at_the_step_it_owed(tiny_model_dir, tmp_path):
    from agentrl.errors import RunError
    from agentrl.models import load_model
    from agentrl.recipe import validate_config
    from agentrl.rollout.ahead import Ahead

    before = set(ray_processes())
    ahead = Ahead(small_config(tmp_path, 4, overlap={"staleness": 1, "backend": "ray"}), str(tiny_model_dir))
    try:
        pid = ray.get(ahead.link.actor.__ray_call__.remote(lambda self: os.getpid()))
        os.kill(pid, signal.SIGKILL)
        ahead.start(0, load_model(str(tiny_model_dir), "float32").named_parameters(), lambda step: "")
        with pytest.raises(RunError, match="the sampler actor .rl.overlap. died before playing RL step 1"):
            ahead.take(1, {})
    finally:
        ahead.close()
    assert not ray.is_initialized()
    assert_nothing_left(before)
    with pytest.raises(ValueError, match="set rl.overlap.ray.num_gpus"):
        validate_config({"rl": {"overlap": {"backend": "ray", "sampler_gpu": 1}}})


KILLED_AT_STEP_2 = """
import os, signal, sys
from pathlib import Path
sys.path.insert(0, {tests!r})
from test_trainer import small_config
from agentrl import trainer as T
from agentrl.rollout import ahead as A

took = A.Ahead.take
def take(self, step, timing):
    played = took(self, step, timing)
    if step == 2:  # the sampler actor is playing step 3
        os.kill(os.getpid(), signal.SIGKILL)
    return played
A.Ahead.take = take
T.RLTrainer(small_config({run_dir!r}, 4, overlap={{"staleness": 1, "backend": "ray"}}), {model!r}, Path({run_dir!r})).run()
"""


def test_a_trainer_killed_beside_its_ray_sampler_leaves_no_ray_process(tiny_model_dir, tmp_path):
    """SIGKILL of the trainer mid-run: the local cluster it started, the sampler actor among its
    workers, goes with it (Ray's agents notice their raylet is gone within about a minute)."""
    import subprocess
    import sys

    before = set(ray_processes())
    script = KILLED_AT_STEP_2.format(tests=str(Path(__file__).parent), run_dir=str(tmp_path / "run"),
                                     model=str(tiny_model_dir))
    with (tmp_path / "output.txt").open("w") as output:  # not a pipe: Ray's processes would hold it open
        killed = subprocess.run([sys.executable, "-c", script], stdout=output, stderr=output, timeout=600)
    assert killed.returncode == -signal.SIGKILL, (tmp_path / "output.txt").read_text()[-2000:]
    assert_nothing_left(before, within_s=180)
