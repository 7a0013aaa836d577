"""What a user meets when something is wrong: bad input exits 2 with one line per problem naming
the file and the field or path, never a traceback; Ctrl-C exits 130 with one line."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Literal

import pytest
import torch
import yaml
from conftest import COMPACT

from agentrl.cli import main
from agentrl.config import Section
from agentrl.envs.pool import ctrl_c_held
from agentrl.errors import RunError

GOOD = {"seed": 1, "run_dir": "RUN", "env": {"type": "household", "max_steps": 4},
        "prompt": {"template": COMPACT, "history_length": 1}, "sampling": {"max_new_tokens": 6},
        "rl": {"steps": 1, "tasks_per_step": 1, "group_size": 2}, "eval": {"episodes": 1, "splits": ["l0"]}}


def write(path, content) -> str:
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content if isinstance(content, str) else yaml.safe_dump(content))
    return str(path)


def with_(**changes) -> dict:
    data = json.loads(json.dumps(GOOD))
    for dotted, value in changes.items():
        node = data
        *parents, leaf = dotted.split("__")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return data


# (case, recipe content or None for the good one, extra arguments, text the message must hold)
BAD_RECIPES = [
    ("yaml syntax", "rl: [steps: 1\n", [], "recipe.yaml: YAML syntax error at line 2"),
    ("not utf-8", b"seed: 1\nrun_dir: \xff\xfe\n", [], "recipe.yaml: not UTF-8 text"),
    ("empty", "", [], "recipe.yaml: the recipe is empty"),
    ("comments only", "# nothing\n", [], "recipe.yaml: the recipe is empty"),
    ("a list", "- seed: 1\n", [], "recipe.yaml: a recipe is a YAML mapping"),
    ("unknown key", with_(bogus=1), [], "recipe.yaml: bogus: Extra inputs are not permitted"),
    ("unknown nested key", with_(rl__optim__learning_rate=1e-3), [], "recipe.yaml: rl.optim.learning_rate"),
    ("unknown estimator", with_(rl__advantage={"type": "gigpoo"}), [], "rl.advantage: Value error, unknown"),
    ("unknown env", with_(env={"type": "kitchen"}), [], "env: Value error, unknown environment 'kitchen'"),
    ("infinite lr", None, ["--set", "rl.optim.lr=.inf"], "recipe.yaml: rl.optim.lr: Input should be a finite"),
    ("nan lr", None, ["--set", "rl.optim.lr=.nan"], "rl.optim.lr: Input should be a finite number"),
    ("negative lr", None, ["--set", "rl.optim.lr=-1e-3"], "rl.optim.lr: Input should be greater than 0"),
    ("infinite kl", None, ["--set", "rl.kl_coef=.inf"], "rl.kl_coef: Input should be a finite number"),
    ("beta of 1", None, ["--set", "rl.optim.betas=[0.9, 1.0]"], "rl.optim.betas.1: Input should be less than 1"),
    ("negative eps", None, ["--set", "rl.advantage.eps=-1e-6"], "rl.advantage.eps: Input should be greater than or"),
    ("negative steps", None, ["--set", "rl.steps=-1"], "rl.steps: Input should be greater than or equal to 0"),
    ("text for a count", None, ["--set", "rl.group_size=many"], "rl.group_size: Input should be a valid integer"),
    ("zero timeout", None, ["--set", "rl.env_pool.step_timeout_s=0"], "rl.env_pool.step_timeout_s: Input should be greater"),
    ("hidden size off 64", with_(init={"hidden_size": 96}), [], "recipe.yaml: init.hidden_size: Input should be a multiple of 64"),
    ("top_p above 1", None, ["--set", "eval.sampling.top_p=1.5"], "eval.sampling.top_p: Input should be less than or equal to 1"),
    ("positional placeholder", with_(prompt__template="{0} {observation} {history}"), [],
     "recipe.yaml: prompt.template: Value error, template placeholders must be among"),
    ("empty placeholder", with_(prompt__template="{} {observation} {history}"), [],
     "recipe.yaml: prompt.template: Value error, template placeholders must be among"),
    ("moved key", None, ["--set", "rl.workers=2"], "rl: Value error, rl.workers is now rl.env_pool.workers"),
    ("unknown pool backend", None, ["--set", "rl.env_pool.backend=slurm"], "rl.env_pool.backend: Input should be"),
    ("unknown rollout mode", None, ["--set", "rl.rollout.mode=eager"], "rl.rollout.mode: Input should be"),
    ("override without =", None, ["--set", "rl.steps"], "override 'rl.steps' is not of the form key.sub=value"),
    ("override empty part", None, ["--set", "rl..steps=1"], "override 'rl..steps=1' is not of the form"),
    ("override bad yaml", None, ["--set", "rl.optim={lr: [1"], "override 'rl.optim={lr: [1': YAML syntax error"),
    ("override into a value", None, ["--set", "seed.x=1"], "override 'seed.x=1': seed is not a section"),
    ("overlap with fsdp2", None, ["--set", "rl.overlap={staleness: 1}", "--set", "rl.actor={backend: fsdp2}"],
     "recipe.yaml: rl: Value error, rl.overlap runs the sampler beside a single-process actor"),
    ("overlap sampler gpu on ray", None, ["--set", "rl.overlap={backend: ray, sampler_gpu: 1}"],
     "recipe.yaml: rl.overlap: Value error, rl.overlap.sampler_gpu picks a local GPU"),
    ("negative staleness", None, ["--set", "rl.overlap.staleness=-1"], "rl.overlap.staleness: Input should be greater"),
    ("vllm option under hf", None, ["--set", "rl.sampler.kv_cache_gib=4"], "rl.sampler.kv_cache_gib: Extra inputs"),
    ("template placeholder", with_(prompt__template="{task} {nope}"), [], "prompt.template"),
    ("window never shown", with_(prompt__template="{task} {observation}", prompt__history_length=2), [],
     "recipe.yaml: prompt: Value error, history_length is 2 but template has no {history} placeholder"),
    ("missing plugin file", None, ["--import", "nowhere/plugin.py"], "plugin file"),
    ("imports not a list", with_(imports="my_plugin.py"), [], "recipe.yaml: imports: a list"),
]


@pytest.mark.parametrize("case, content, extra, message", BAD_RECIPES, ids=[c[0] for c in BAD_RECIPES])
def test_bad_recipes_and_overrides_exit_2_with_one_line(tmp_path, capsys, case, content, extra, message):
    recipe = write(tmp_path / "recipe.yaml", with_(run_dir=str(tmp_path / "run")) if content is None else content)
    assert main(["train", recipe, *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "Traceback" not in err
    assert len(err.splitlines()) == 1, err
    assert not (tmp_path / "run").exists()  # nothing started


def test_bad_paths_exit_2_at_once_naming_the_path(tmp_path, capsys, tiny_model_dir, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    good = write(tmp_path / "recipe.yaml", with_(run_dir=str(tmp_path / "run")))
    bad_lines = write(tmp_path / "data.jsonl", '{"messages": [{"role": "user", "content": "hi"}]}\n{"oops": 1}\n')
    no_model = tmp_path / "no-model"
    no_model.mkdir()
    cases = [
        (["train", good, "--model", str(tmp_path / "missing")], f"model {tmp_path / 'missing'} does not exist"),
        (["train", good, "--model", "runs/nothing/here"], "model runs/nothing/here does not exist"),
        (["train", good, "--model", "SomeOrg/some-model"], "not in the Hugging Face cache, and the hub is not reachable"),
        (["train", good, "--model", str(no_model)], "the folder has no config.json"),
        (["eval", good, "--checkpoint", str(tmp_path / "ckpt"), "--out", str(tmp_path / "ev")], "does not exist"),
        (["sft", good, "--data", str(tmp_path / "none.jsonl"), "--out", str(tmp_path / "o"), "--model",
          str(tiny_model_dir)], "chat dataset"),
        (["sft", good, "--data", bad_lines, "--out", str(tmp_path / "o"), "--model", str(tiny_model_dir)],
         "data.jsonl:2: expected a JSON object"),
        (["run", write(tmp_path / "r1.yaml", with_(run_dir=str(tmp_path / "run"), model={"path": "nope/none/x"}))],
         "model nope/none/x does not exist"),
        (["run", write(tmp_path / "r2.yaml", with_(run_dir=str(tmp_path / "run"), model={"path": str(tiny_model_dir)},
                                                   sft={"data": str(tmp_path / "none.jsonl")}))], "sft.data"),
        (["run", write(tmp_path / "r5.yaml", with_(run_dir=str(tmp_path / "run"), init={"corpus": "nowhere.jsonl"}))],
         "init.corpus: nowhere.jsonl does not exist"),
        (["prepare", write(tmp_path / "r3.yaml", with_(env={"type": "alfworld", "data": str(tmp_path / "games")}))],
         "env.data: ALFWorld data"),
        (["sft", write(tmp_path / "r4.yaml", with_(env={"type": "scienceworld", "splits_dir": str(tmp_path)})),
          "--data", bad_lines, "--out", str(tmp_path / "o")], "model.path"),
    ]
    for argv, message in cases:
        start = time.perf_counter()
        assert main(argv) == 2, argv
        err = capsys.readouterr().err.strip()
        assert message in err and "Traceback" not in err and len(err.splitlines()) == 1, (argv, err)
        assert time.perf_counter() - start < 30, argv  # at once: no retries against a hub
    assert not (tmp_path / "run").exists()


def test_debug_shows_the_traceback(tmp_path):
    recipe = write(tmp_path / "recipe.yaml", "rl: [steps: 1\n")
    env = {**os.environ, "AGENTRL_DEBUG": "1"}
    done = subprocess.run([sys.executable, "-m", "agentrl.cli", "train", recipe], capture_output=True, text=True,
                          env=env)
    assert done.returncode != 0 and "Traceback" in done.stderr and "YAML syntax error" in done.stderr


def _spawned(group: int) -> list[int]:
    """The processes of the process group that multiprocessing spawned (workers, the sampler process;
    not its resource tracker)."""
    listed = subprocess.run(["pgrep", "-a", "-g", str(group)], capture_output=True, text=True).stdout.splitlines()
    return [int(line.split()[0]) for line in listed if "spawn_main" in line]


def _ctrl_c_state(pid: int) -> tuple[bool, bool]:
    """Whether the process ignores SIGINT, and whether it holds it back (its main thread's mask)."""
    fields = dict(line.split(":\t") for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":\t" in line)
    bit = 1 << (signal.SIGINT - 1)
    return bool(int(fields["SigIgn"], 16) & bit), bool(int(fields["SigBlk"], 16) & bit)


def _stop_group(proc) -> None:
    """Leave no process of a test's process group behind, whatever the test found."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def _left_in_group(group: int) -> list[str]:
    """The group's processes still there after up to 10 s (a parent's orderly shutdown)."""
    left = ["?"]
    for _ in range(20):
        left = subprocess.run(["pgrep", "-a", "-g", str(group)], capture_output=True, text=True).stdout.splitlines()
        if not left:
            break
        time.sleep(0.5)
    return left


def test_ctrl_c_is_held_only_while_worker_processes_start():
    """The hold covers the start, then gives back the thread's own mask (a hold already there stays)."""
    def held() -> bool:
        return signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, [])

    assert not held()
    with ctrl_c_held():
        assert held()
    assert not held()
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        with ctrl_c_held():
            pass
        assert held()
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


@pytest.mark.parametrize("when", ["starting", "playing"])
def test_ctrl_c_while_expert_data_is_played_in_worker_processes_is_one_line(tmp_path, when):
    """`agentrl data` with worker processes (the recipe's environment pool has workers): Ctrl-C
    from a terminal reaches the whole process group, and only the parent answers it (exit 130,
    one line); the workers leave quietly, no traceback of theirs, no process left: while they
    are still starting (importing torch, for seconds) and while they play episodes, when each
    ignores Ctrl-C and does not hold it back (its own children inherit both)."""
    recipe = write(tmp_path / "recipe.yaml", with_(run_dir=str(tmp_path / "run"), rl__env_pool__workers=2))
    proc = subprocess.Popen([sys.executable, "-m", "agentrl.cli", "data", recipe, "--out", str(tmp_path / "d.jsonl"),
                             "--episodes", "100000"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.time() + 120
        while len(workers := _spawned(proc.pid)) < 2 and time.time() < deadline and proc.poll() is None:
            time.sleep(0.1)
        assert len(workers) == 2, proc.communicate()
        if when == "playing":
            partial = tmp_path / "d.jsonl.tmp"
            while not (partial.exists() and partial.stat().st_size) and time.time() < deadline and proc.poll() is None:
                time.sleep(0.5)
            time.sleep(2)  # every worker past its start: playing episodes
            assert [_ctrl_c_state(pid) for pid in workers] == [(True, False)] * 2
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=60)
        left = _left_in_group(proc.pid)
    finally:
        _stop_group(proc)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert err.strip().endswith("rerun the same command to continue")
    assert left == [], "a worker process outlived the parent"
    assert not (tmp_path / "d.jsonl").exists()  # not complete: not under its final name


@pytest.mark.parametrize("overlap", [None, {"staleness": 1}], ids=["environment-workers", "sampler-process"])
def test_ctrl_c_while_rl_starts_its_processes_is_one_line(tmp_path, tiny_model_dir, overlap):
    """Ctrl-C from a terminal as RL's first spawned process appears (an environment worker; with
    rl.overlap, the sampler process), while it still imports: exit 130 with the parent's one line,
    no traceback of the child's, no process left."""
    recipe = write(tmp_path / "recipe.yaml", with_(run_dir=str(tmp_path / "run"), rl__steps=100_000,
                                                  rl__env_pool__workers=2, rl__overlap=overlap))
    proc = subprocess.Popen([sys.executable, "-m", "agentrl.cli", "train", recipe, "--model", str(tiny_model_dir)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.time() + 120
        while not _spawned(proc.pid) and time.time() < deadline and proc.poll() is None:
            time.sleep(0.05)
        assert _spawned(proc.pid), proc.communicate()
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=60)
        left = _left_in_group(proc.pid)
    finally:
        _stop_group(proc)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert err.strip().splitlines()[-1].startswith("interrupted at ")
    assert left == []


@pytest.mark.parametrize("overlap, stop", [(None, "ctrl-c"), ({"staleness": 1}, "ctrl-c"), (None, "kill")],
                         ids=["in-process", "sampler-process", "sigterm"])
def test_ctrl_c_or_kill_stops_with_one_line_and_no_worker_left(tmp_path, tiny_model_dir, overlap, stop):
    """SIGINT to the whole process group (what a terminal sends) during RL with worker
    processes (and with rl.overlap, the sampler process and its own workers): exit 130, one line
    saying where, no worker traceback, no process left. SIGTERM to the trainer alone (`kill`,
    `timeout`, a scheduler's preemption): the same, exit 143."""
    recipe = write(tmp_path / "recipe.yaml", with_(run_dir=str(tmp_path / "run"), rl__steps=100_000,
                                                  rl__env_pool__workers=2, rl__tasks_per_step=2,  # never done first
                                                  rl__overlap=overlap))
    # As from a terminal: SIGINT handled (a suite run as a background job inherits it ignored).
    proc = subprocess.Popen([sys.executable, "-m", "agentrl.cli", "train", recipe, "--model", str(tiny_model_dir)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    logs = tmp_path / "run" / "rl" / "logs" / "metrics.jsonl"
    deadline = time.time() + 240
    while not (logs.exists() and logs.read_text().strip()) and time.time() < deadline and proc.poll() is None:
        time.sleep(0.5)
    assert proc.poll() is None, proc.communicate()
    children = subprocess.run(["pgrep", "-g", str(proc.pid)], capture_output=True, text=True).stdout.split()
    assert len(children) >= 3  # the trainer and its two environment workers
    spawned = _spawned(proc.pid)  # the workers, and with rl.overlap the sampler process and its own workers
    assert len(spawned) == (2 if overlap is None else 3)
    assert [_ctrl_c_state(pid) for pid in spawned] == [(True, False)] * len(spawned)
    if stop == "kill":
        os.kill(proc.pid, signal.SIGTERM)
    else:
        os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == (143 if stop == "kill" else 130), err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    word = "terminated" if stop == "kill" else "interrupted"
    assert err.strip().splitlines()[-1].startswith(f"{word} at RL step ")
    assert err.strip().endswith("rerun the same command to continue")
    assert _left_in_group(proc.pid) == []


# --- runs that cannot go on stop with the cause ---------------------------------------------------
def test_a_run_whose_episodes_all_abort_stops_naming_the_timeout(tmp_path, tiny_model_dir, capsys):
    recipe = write(tmp_path / "recipe.yaml", with_(run_dir=str(tmp_path / "run"), rl__env_pool={"workers": 2, "reset_timeout_s": 0.001}))
    assert main(["train", recipe, "--model", str(tiny_model_dir)]) == 1
    err = capsys.readouterr().err.strip()
    assert "2 of 2 episodes aborted in RL step 1 (more than rl.max_aborted_share = 0.5)" in err, err
    assert "within the time limit (rl.env_pool.reset_timeout_s = 0.001 each)" in err
    assert "Traceback" not in err


def test_an_evaluation_without_finished_episodes_is_an_error_and_never_cached(tmp_path, tiny_model_dir, capsys):
    recipe = write(tmp_path / "recipe.yaml", with_(run_dir=str(tmp_path / "run"), model={"path": str(tiny_model_dir)},
                                                  rl__env_pool={"workers": 1, "reset_timeout_s": 0.001}))
    assert main(["run", recipe]) == 1
    assert "evaluation on l0: 1 of 1 episodes aborted" in capsys.readouterr().err
    assert not (tmp_path / "run" / "eval" / "initial" / "results.json").exists()
    phases = json.loads((tmp_path / "run" / "phases.json").read_text())
    assert "eval initial" not in phases
    assert main(["run", recipe, "--set", "rl.env_pool.reset_timeout_s=300", "--set", "rl.steps=0"]) == 0  # fixed: redone
    assert json.loads((tmp_path / "run" / "eval" / "initial" / "results.json").read_text())["l0"]["episodes"] == 1


@pytest.mark.parametrize("share, cause", [(0.5, "exited during a reset (exit code 1)"),
                                          (1.0, "exited before answering 3 times in a row")])
def test_workers_that_die_on_start_stop_the_run_with_the_main_guard_hint(tmp_path, tiny_model_dir, share, cause):
    """The README's rule, broken: a script that trains with worker processes and no
    `if __name__ == "__main__":` guard (each worker imports it and tries to train too). Stopped by
    the aborted share, or, when every abort is tolerated, by the third start failure in a row."""
    script = tmp_path / "unguarded.py"
    recipe = with_(run_dir=str(tmp_path / "run"), rl__env_pool__workers=1, rl__max_aborted_share=share)
    script.write_text(f"""
from pathlib import Path
from agentrl.recipe import validate_config
from agentrl.trainer import RLTrainer

config = validate_config({json.dumps(recipe)})
with RLTrainer(config, {str(tiny_model_dir)!r}, Path(config.run_dir)) as trainer:
    for _ in range(4):
        trainer.train_step()
""")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert done.returncode != 0
    assert "RunError" in done.stderr and cause in done.stderr, done.stderr[-3000:]
    assert 'must do so under `if __name__ == "__main__":`' in done.stderr


def test_a_worker_that_died_while_idle_is_replaced_before_new_episodes(tmp_path):
    from agentrl.config import EnvPoolConfig
    from agentrl.envs.household.env import HouseholdEnvConfig
    from agentrl.envs.pool import EnvPool

    with EnvPool(HouseholdEnvConfig(), EnvPoolConfig(workers=1)) as pool:
        assert pool.reset({0: "train-0"})[0] is not None
        pool.transport.procs[0].kill()
        pool.transport.procs[0].join()
        assert pool.reset({0: "train-1"})[0] is not None  # a new episode is not charged for it
        assert len(pool.faults) == 1 and "exited while idle" in pool.faults[0]
        pool.transport.procs[0].kill()
        pool.transport.procs[0].join()
        assert pool.step({0: "look"}) == {0: None}  # the episode in flight died with its worker


class NaNLossConfig(Section):
    type: Literal["nan_loss"] = "nan_loss"


NAN = {"on": True}
"""Whether nan_loss is not a number (else a plain policy-gradient loss)."""


def nan_loss(logp, old_logp, advantages, segments, config):
    if not NAN["on"]:
        return -advantages * torch.exp(logp - old_logp), {}
    return logp * float("nan"), {}


def test_non_finite_updates_are_skipped_counted_and_stop_the_run(tmp_path, tiny_model_dir):
    from pathlib import Path

    from agentrl.recipe import validate_config
    from agentrl.registry import POLICY_LOSSES
    from agentrl.trainer import RLTrainer

    if "nan_loss" not in POLICY_LOSSES.names():
        POLICY_LOSSES.register("nan_loss", NaNLossConfig, target=nan_loss)
    NAN["on"] = True
    config = validate_config(with_(run_dir=str(tmp_path / "run"), rl__loss={"type": "nan_loss"},
                                   rl__max_skipped_updates=2, rl__optim={"lr": 1e-2}))
    with RLTrainer(config, str(tiny_model_dir), Path(config.run_dir)) as trainer:
        before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
        metrics = trainer.train_step()
        assert metrics["actor/skipped_updates"] == 1
        assert all(torch.equal(before[k], v) for k, v in trainer.model.state_dict().items())
        assert not trainer.actor.optimizer.state  # Adam never stepped
        NAN["on"] = False
        assert trainer.train_step()["actor/skipped_updates"] == 0
        NAN["on"] = True
        assert trainer.train_step()["actor/skipped_updates"] == 1  # 2 skipped in all, 1 in a row: goes on
        with pytest.raises(RunError, match="2 optimiser updates in a row had a non-finite loss"):
            trainer.train_step()


# --- external endpoints that misbehave ------------------------------------------------------------
class Misbehaving:
    """A real HTTP server on 127.0.0.1 that answers each request with the next failure of
    `failures` (then a good chat-completions reply: every answer `<verdict>good</verdict>`)."""

    GOOD = {"choices": [{"message": {"content": "<think>fine</think><verdict>good</verdict>"}}]}

    def __init__(self, failures: list[str]):
        import http.server
        import threading

        owner = self
        self.failures, self.requests = list(failures), 0

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                owner.requests += 1
                mode = owner.failures.pop(0) if owner.failures else "good"
                if mode == "drop":  # accept, read, close without a reply
                    self.close_connection = True
                    return
                if mode == "slow":
                    time.sleep(1.5)
                status, payload = 200, {"good": {"choices": owner.GOOD["choices"] * body.get("n", 1)},
                                        "null_choices": {"choices": None}, "a_list": [1, 2],
                                        "number_content": {"choices": [{"message": {"content": 5}}]},
                                        "no_message": {"choices": [{"text": "hi"}]}, "slow": owner.GOOD}.get(mode, {})
                raw = json.dumps(payload).encode()
                if mode == "http_500":
                    status = 500
                if mode == "not_json":
                    raw = b"<html>proxy error</html>"
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw) + (10 if mode == "truncated" else 0)))
                self.end_headers()
                self.wfile.write(raw)

        class Server(http.server.ThreadingHTTPServer):
            def handle_error(self, request, client_address):
                pass  # the client gave up on a slow reply: expected here

        self.server = Server(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_port}/v1"

    def close(self):
        self.server.shutdown()
        self.server.server_close()


FAILURES = ["drop", "null_choices", "a_list", "number_content", "no_message", "http_500", "not_json", "truncated",
            "slow"]


def test_every_endpoint_failure_is_retried_then_given_up_cleanly():
    from agentrl.gcd.judge import ChatEndpoint, EndpointError

    server = Misbehaving(FAILURES)
    try:
        endpoint = ChatEndpoint(server.url, "m", None, timeout_s=1.0, retries=len(FAILURES), backoff_s=0.01)
        assert endpoint.complete("hi", n=2) == [Misbehaving.GOOD["choices"][0]["message"]["content"]] * 2
        assert server.requests == len(FAILURES) + 1  # each failure retried
        for failure in FAILURES:
            server.failures = [failure, failure]
            with pytest.raises(EndpointError, match=r"\(2 attempts\)"):
                ChatEndpoint(server.url, "m", None, timeout_s=1.0, retries=1, backoff_s=0.01).complete("hi")
    finally:
        server.close()


def test_a_training_step_carries_on_through_a_misbehaving_judge_and_summariser(tmp_path, tiny_model_dir):
    from pathlib import Path

    from agentrl.gcd.correction import PromptCorrection
    from agentrl.gcd.judge import ChatEndpoint
    from agentrl.gcd.loss import CorrectionConfig
    from agentrl.recipe import validate_config
    from agentrl.trainer import RLTrainer

    server = Misbehaving(FAILURES)
    try:
        external = {"base_url": server.url, "model": "m", "asks": 1, "agree": 1, "pairs_per_step": 4,
                    "timeout_s": 1.0, "retries": 1, "backoff_s": 0.01}
        config = validate_config(with_(run_dir=str(tmp_path / "run"), rl__tasks_per_step=2, rl__aux=[
            {"type": "gcd", "pairs_per_step": 2, "group_size": 2, "sampling": {"max_new_tokens": 4},
             "labels": ["llm", "env"], "external": external}]))
        with RLTrainer(config, str(tiny_model_dir), Path(config.run_dir)) as trainer:
            first = trainer.train_step()
            second = trainer.train_step()
        assert first["aux/gcd/labels/llm_errors"] > 0  # counted, not raised
        assert second.get("aux/gcd/labels/llm_good", 0) > 0  # the server recovered: labels again

        class Source:
            critiques = [("go to desk 1", "it was pointless")]

        server.failures = ["drop", "drop"]
        endpoint = ChatEndpoint(server.url, "m", None, timeout_s=1.0, retries=1, backoff_s=0.01)
        correction = PromptCorrection(CorrectionConfig(every=1, summarizer="endpoint"), Source(), None, None, endpoint,
                                      tmp_path / "correction.jsonl")
        correction.hint = "Mistakes to avoid:\n- earlier"
        assert correction.refresh(2) == "Mistakes to avoid:\n- earlier" and correction.errors == 1
        assert "error" in json.loads((tmp_path / "correction.jsonl").read_text().splitlines()[-1])
        assert correction.refresh(3).startswith("Mistakes to avoid:\n<think>fine")  # recovered
    finally:
        server.close()


# --- interrupted phases ---------------------------------------------------------------------------
def test_a_pipeline_killed_inside_each_phases_save_reruns_to_the_same_results(tmp_path):
    """SIGKILL in the middle of a write of each phase's output (the tiny model, the expert data,
    the SFT model, evaluation results, provenance, RL checkpoints, the summary), rerunning
    after each: the run completes, and its results equal an uninterrupted run's."""
    def recipe(run_dir):
        return write(tmp_path / f"{run_dir}.yaml", {
            "seed": 1, "run_dir": str(tmp_path / run_dir), "init": {"layers": 1, "intermediate_size": 128,
                                                                   "corpus_episodes": 20},
            "env": {"type": "household", "max_steps": 10}, "prompt": {"template": COMPACT, "history_length": 1},
            "sampling": {"max_new_tokens": 6}, "sft": {"episodes": 3, "epochs": 1, "batch_size": 8},
            "rl": {"steps": 2, "tasks_per_step": 2, "group_size": 2, "save_every": 1},
            "eval": {"episodes": 2, "splits": ["l0", "l1"]}})

    def run(path, kill_at="nothing@1"):
        done = subprocess.run([sys.executable, str(Path(__file__).parent / "killer.py"), kill_at, "run", path],
                              capture_output=True, text=True, timeout=600)
        assert done.returncode in (0, -signal.SIGKILL), done.stderr[-3000:]
        return done.returncode

    assert run(recipe("straight")) == 0
    path = recipe("killed")
    kill_points = ["model-init@1", "eval/initial@1", "data.jsonl@1", "sft/model@1", "phases.json@2", "eval/sft@1",
                   "checkpoints@1", "checkpoints@3", "eval/rl@1", "summary.json@1"]  # in the pipeline's order
    codes = [run(path, point) for point in kill_points]
    assert codes == [-signal.SIGKILL] * len(kill_points)  # each rerun went on to the next point
    assert run(path) == 0
    straight = json.loads((tmp_path / "straight" / "summary.json").read_text())["phases"]
    assert json.loads((tmp_path / "killed" / "summary.json").read_text())["phases"] == straight


def test_metrics_log_survives_a_line_cut_by_a_kill_and_a_restart_drops_stale_steps(tmp_path):
    from agentrl.tracking import Tracker, read_metrics

    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "metrics.jsonl").write_text('{"step": 1, "a": 1.0}\n{"step": 2, "a": 2.0}\n{"step": 3, "a"')
    Tracker(logs, resume_step=2).close()  # resumed from step 2's checkpoint: the cut line goes
    assert [r["step"] for r in read_metrics(logs / "metrics.jsonl")] == [1, 2]
    Tracker(logs, resume_step=0).close()  # started over (killed before the first checkpoint)
    assert read_metrics(logs / "metrics.jsonl") == []


def test_an_atomic_write_cut_short_leaves_the_old_file(tmp_path, monkeypatch):
    """`write_atomic` (every config, summary and record the phases write): a write that fails part
    way leaves the old file whole and no other file; one that completes leaves only the new file."""
    from agentrl.files import write_atomic

    target = tmp_path / "summary.json"
    target.write_text("old")
    original = Path.write_text

    def full_disk(self, text, *args, **kwargs):
        original(self, text[:2], *args, **kwargs)
        raise OSError("No space left on device")

    monkeypatch.setattr(Path, "write_text", full_disk)
    with pytest.raises(OSError, match="No space left"):
        write_atomic(target, "new contents")
    monkeypatch.undo()
    assert target.read_text() == "old"
    write_atomic(target, "new contents")
    assert target.read_text() == "new contents"
    assert [p.name for p in tmp_path.iterdir() if p.name != ".summary.json.tmp"] == ["summary.json"]
