"""rl.overlap: the sampler in its own process, up to k updates ahead of the trainer."""

import importlib.util
import multiprocessing
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from test_trainer import run, small_config, strip_timing

from agentrl.checkpoint import list_checkpoints
from agentrl.errors import RunError
from agentrl.models import load_model
from agentrl.rollout.ahead import Ahead, fingerprint
from agentrl.rollout.records import read_trajectories
from agentrl.tracking import read_metrics
from agentrl.trainer import RLTrainer


def final_weights(run_dir):
    return load_file(list_checkpoints(run_dir)[-1] / "model" / "model.safetensors")


def versions(run_dir, steps):
    return [sorted({t.version for t in read_trajectories(run_dir / "rollouts" / f"step_{s:06d}.jsonl.gz")})
            for s in range(1, steps + 1)]


def test_staleness_0_plays_the_in_process_runs_samples_and_1_samples_each_step_with_the_weights_it_records(
        tiny_model_dir, tmp_path):
    """k = 0 in its own process, on the trainer's thread count (1 here, where torch's default is every
    core): the in-process run's samples, weights and metrics, bit for bit but for what the sampler's
    log-probs give, which another process's BLAS may round differently (seen once in CI: 1e-8).
    k = 1: step s is sampled by update s - 2's weights (the first two by the initial ones), and the
    sampled tokens' recorded log-probs are those weights' own: the version names what sampled."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for name, overlap in (("here", None), ("k0", {"staleness": 0})):
            run(small_config(tmp_path / name, 3, overlap=overlap), tiny_model_dir)
    finally:
        torch.set_num_threads(threads)
    config = small_config(tmp_path / "k1", 3, overlap={"staleness": 1}, keep_last=3)
    with RLTrainer(config, str(tiny_model_dir), tmp_path / "k1") as trainer:
        trainer.run()
    here, k0, k1 = (final_weights(tmp_path / name) for name in ("here", "k0", "k1"))
    assert all(torch.equal(here[name], k0[name]) for name in here)
    assert not all(torch.equal(here[name], k1[name]) for name in here)
    rows = [strip_timing(read_metrics(tmp_path / name / "logs" / "metrics.jsonl")) for name in ("here", "k0")]
    rounded = ("rollout/logprob_diff_mean", "rollout/logprob_diff_max", "rollout/kl_sampler_actor", "actor/kl_old")
    for k0_row in rows[1]:  # what only an overlapped run has: each side's threads
        assert (k0_row.pop("overlap/sampler_threads"), k0_row.pop("overlap/trainer_threads")) == (1, 1)
    for here_row, k0_row in zip(*rows, strict=True):
        assert {k: v for k, v in here_row.items() if k not in rounded} == {k: v for k, v in k0_row.items() if k not in rounded}
        assert [here_row[k] for k in rounded] == pytest.approx([k0_row[k] for k in rounded], rel=1e-4, abs=1e-7)
    played = [[(s.prompt_ids, s.response_ids, s.logprobs) for path in sorted((tmp_path / name / "rollouts").glob("step_*"))
               for t in read_trajectories(path) for s in t.steps] for name in ("here", "k0")]
    assert len(played[0]) == len(played[1]) > 0
    assert [step[:2] for step in played[0]] == [step[:2] for step in played[1]]
    assert all(torch.allclose(torch.tensor(a[2]), torch.tensor(b[2]), atol=1e-5) for a, b in zip(*played))
    assert versions(tmp_path / "k0", 3) == [[0], [1], [2]]

    assert versions(tmp_path / "k1", 3) == [[0], [0], [1]]
    assert read_metrics(tmp_path / "k1" / "logs" / "metrics.jsonl")[-1]["rollout/staleness"] == 1.0
    update_1 = load_model(str(list_checkpoints(tmp_path / "k1")[0] / "model"), "float32")
    now = trainer.model  # the weights after update 3: not what sampled step 3
    for model, same in ((update_1, True), (now, False)):
        close = [torch.allclose(logprobs(model, s.prompt_ids, s.response_ids), torch.tensor(s.logprobs), atol=1e-4)
                 for t in trainer.trajectories for s in t.steps]
        assert all(close) if same else not any(close)


def test_each_side_runs_on_its_own_threads(tiny_model_dir, tmp_path):
    """rl.overlap.trainer_threads sets the trainer's torch threads and sampler_threads the sampler
    process's; unset, the sampler takes the trainer's. Each step logs both."""
    threads = torch.get_num_threads()
    try:
        for sides in ({"sampler_threads": 2, "trainer_threads": 1}, {"trainer_threads": 2}):
            config = small_config(tmp_path / str(len(sides)), 1, overlap={"staleness": 0, **sides})
            with RLTrainer(config, str(tiny_model_dir), tmp_path / str(len(sides))) as trainer:
                metrics = trainer.train_step()
            expected = sides.get("sampler_threads", sides["trainer_threads"]), sides["trainer_threads"]
            assert (metrics["overlap/sampler_threads"], metrics["overlap/trainer_threads"]) == expected
    finally:
        torch.set_num_threads(threads)


def test_the_trainer_starts_no_environments_while_the_sampler_process_plays_them(tiny_model_dir, tmp_path):
    """With rl.overlap the sampler process has the environment workers; the trainer's own pool
    (evaluation's) is not started by training steps."""
    config = small_config(tmp_path, 1, overlap={"staleness": 1}, env_pool={"workers": 1})
    with RLTrainer(config, str(tiny_model_dir), tmp_path) as trainer:
        trainer.train_step()
        assert [p.pid for p in multiprocessing.active_children()] == [trainer.ahead.link.process.pid]


def logprobs(model, prompt, response):
    """The response's log-probs under `model` (on its own device: the trainer's is the GPU where there is one)."""
    ids = torch.tensor([prompt + response], device=next(model.parameters()).device)
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1:-1].float().cpu()
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(response)[:, None])[:, 0]


NO_RAY = pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="Ray is not installed")


@pytest.fixture(params=["process", pytest.param("ray", marks=NO_RAY)])
def ahead(request, tiny_model_dir, tmp_path):
    """The trainer's end of a k = 1 sampler, in a process of its own or a Ray actor."""
    config = small_config(tmp_path, 4, overlap={"staleness": 1, "backend": request.param})
    process = Ahead(config, str(tiny_model_dir))
    yield process, load_model(str(tiny_model_dir), "float32")
    process.close()


@pytest.mark.parametrize("backend", ["process", pytest.param("ray", marks=NO_RAY)])
def test_a_sampler_that_cannot_start_stops_the_run_with_its_cause(tmp_path, backend):
    ahead = Ahead(small_config(tmp_path, 2, overlap={"staleness": 1, "backend": backend}), str(tmp_path / "no-model"))
    try:
        ahead.start(0, [("w", torch.zeros(2))], lambda step: "")
        with pytest.raises(RunError, match=r"the sampler \(rl.overlap\), RL step 1: \w+Error: .*no-model"):
            ahead.take(1, {})
    finally:
        ahead.close()


def test_an_answer_for_another_step_than_the_one_due_stops_the_run(ahead):
    """The sampler answers steps in the order asked: step 1's rollout taken where step 2 is due is
    a broken link, not a rollout to train on."""
    process, model = ahead
    process.start(0, model.named_parameters(), lambda step: "")
    with pytest.raises(RunError, match="the sampler played RL step 1 where step 2 was due"):
        process.take(2, {})

def test_a_step_sampled_more_than_k_updates_behind_stops_the_run(ahead):
    process, model = ahead
    process.start(0, model.named_parameters(), lambda step: "")
    process.take(1, {})
    process.take(2, {})
    process.link.send(("play", 3, ""))  # asked for without pushing update 1's weights first
    with pytest.raises(RunError, match="more than rl.overlap.staleness = 1 updates behind"):
        process.take(3, {})


def test_weights_that_are_not_the_version_they_claim_stop_the_run(ahead):
    process, model = ahead
    process.start(0, model.named_parameters(), lambda step: "")
    process.take(1, {})
    process.take(2, {})
    recorded = {name: p.detach().clone() for name, p in model.named_parameters()}
    process.fingerprints[1] = fingerprint(recorded.items())
    sent = {name: p + 0.01 for name, p in recorded.items()}  # what arrived is not what was recorded
    process.link.send(("weights", 1, sent))
    process.link.send(("play", 3, ""))
    with pytest.raises(RunError, match="not those of update 1: a weight push did not arrive"):
        process.take(3, {})


def test_each_step_played_ahead_has_its_own_steps_hint(ahead):
    """A step played ahead is asked with the hint the components give for that step, not for the
    step being trained when it was asked (the first k + 1 at the start, each later one after an
    update)."""
    process, model = ahead
    hint = lambda step: f"hint of step {step}"
    process.start(0, model.named_parameters(), hint)
    for step in (1, 2, 3):
        trajectories, _ = process.take(step, {})
        prompts = [s.prompt for t in trajectories for s in t.steps]
        assert prompts and all(p.startswith(f"hint of step {step}\n") for p in prompts), step
        process.after_update(step, model.named_parameters(), hint)


def test_a_sampler_stopped_with_a_step_played_ahead_and_never_taken_leaves_at_once(tiny_model_dir, tmp_path):
    """Ctrl-C between steps: the step played ahead (more than a pipe holds) is never taken. The
    process still leaves at once, and the trainer's exit is not held by it."""
    config = small_config(tmp_path, 4, overlap={"staleness": 1}, tasks_per_step=8)
    ahead = Ahead(config, str(tiny_model_dir))
    model = load_model(str(tiny_model_dir), "float32")
    ahead.start(0, model.named_parameters(), lambda step: "")
    ahead.take(1, {})
    while ahead.link.results.empty():  # step 2's answer on its way, unread
        time.sleep(0.1)
    started = time.monotonic()
    ahead.close()
    assert time.monotonic() - started < 15 and not ahead.link.process.is_alive()


DEAD_SAMPLER = """
import os, signal, sys
from pathlib import Path
from test_trainer import small_config
from agentrl.errors import RunError
from agentrl.models import load_model
from agentrl.rollout.ahead import Ahead


def main(model_dir, run_dir):
    ahead = Ahead(small_config(Path(run_dir), 6, overlap={"staleness": 1}), model_dir)
    model = load_model(model_dir, "float32")
    ahead.start(0, model.named_parameters(), lambda step: "")
    ahead.take(1, {})
    os.kill(ahead.link.process.pid, signal.SIGKILL)
    ahead.link.process.join()
    for step in (1, 2, 3):  # pushes no one will read
        ahead.after_update(step, model.named_parameters(), lambda step: "")
    try:
        ahead.take(2, {})
    except RunError as error:
        print(error, flush=True)
    ahead.close()


if __name__ == "__main__":
    main(*sys.argv[1:])
"""


def test_a_sampler_process_killed_mid_run_stops_the_run_at_the_step_it_owed_and_the_exit_is_not_held(
        tiny_model_dir, tmp_path):
    """The sampler process killed after a step, three weight pushes sent to it after: the trainer
    says which step it owed and its process leaves (its queue's pushes never read do not hold it)."""
    script = tmp_path / "dead_sampler.py"
    script.write_text(DEAD_SAMPLER)
    tests, src = Path(__file__).parent, Path(__file__).parents[1] / "src"
    proc = subprocess.run([sys.executable, str(script), str(tiny_model_dir), str(tmp_path / "run")], capture_output=True,
                          text=True, timeout=240, env={**os.environ, "PYTHONPATH": f"{src}:{tests}"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "the sampler process (rl.overlap) died with exit code -9 before playing RL step 2" in proc.stdout


def test_the_fingerprint_tells_weights_apart_and_ignores_their_order():
    a = {"w": torch.arange(10_000, dtype=torch.float32), "b": torch.zeros(3)}
    b = {"w": a["w"].clone(), "b": torch.tensor([0.0, 0.0, 1e-7])}
    assert fingerprint(a.items()) == fingerprint(reversed(list(a.items())))
    assert fingerprint(a.items()) != fingerprint(b.items())
    # an update that moved only the far end of a large tensor (past its first 4,096 elements)
    moved = a["w"].clone()
    moved[5_000:] += 1.0
    assert fingerprint(a.items()) != fingerprint({"w": moved, "b": a["b"]}.items())


KILLED_AFTER_STEP_2 = """
import os, signal, sys
from pathlib import Path
sys.path.insert(0, {tests!r})
from test_trainer import small_config
from agentrl import trainer as T
from agentrl.rollout import ahead as A

took = A.Ahead.take
def take(self, step, timing):
    played = took(self, step, timing)
    if step == 3:  # step 2's checkpoint is saved; step 4 is asked for, after update 2's weights
        self.link.results.get(timeout=300)  # step 4 played: the sampler has read every request and waits
        Path({pid_file!r}).write_text(str(self.link.process.pid))
        os.kill(os.getpid(), signal.SIGKILL)
    return played
A.Ahead.take = take
T.RLTrainer(small_config({run_dir!r}, 4, overlap={{"staleness": 1}}, keep_last=4), {model!r}, Path({run_dir!r})).run()
"""


def running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_a_killed_run_resumes_with_the_checkpoints_weights_ahead_and_leaves_no_sampler(tiny_model_dir, tmp_path):
    """A run SIGKILLed after step 2's checkpoint, its sampler idle with nothing left to read:
    the sampler process leaves by itself, and the run resumes: step 3 samples with update 2's weights (an uninterrupted run: update 1's, which
    no checkpoint holds) and step 4 with them too, then training goes on to the end."""
    run_dir, pid_file = tmp_path / "run", tmp_path / "sampler.pid"
    script = KILLED_AFTER_STEP_2.format(tests=str(Path(__file__).parent), pid_file=str(pid_file),
                                        run_dir=str(run_dir), model=str(tiny_model_dir))
    with (tmp_path / "output.txt").open("w") as output:  # not a pipe: the sampler would hold it open
        killed = subprocess.run([sys.executable, "-c", script], stdout=output, stderr=output, timeout=600)
    assert killed.returncode == -signal.SIGKILL, (tmp_path / "output.txt").read_text()[-2000:]
    sampler = int(pid_file.read_text())
    deadline = time.monotonic() + 30
    while running(sampler):
        assert time.monotonic() < deadline, "the sampler process outlived its trainer"
        time.sleep(0.2)
    run(small_config(run_dir, 4, overlap={"staleness": 1}, keep_last=4), tiny_model_dir, resume=True)
    assert versions(run_dir, 4) == [[0], [0], [2], [2]]
    assert [r["step"] for r in read_metrics(run_dir / "logs" / "metrics.jsonl")] == [1, 2, 3, 4]
