"""Data-parallel actors with real torch.distributed (gloo, 2 processes): the same global batch
gives the same update as one process, and sharded checkpoints restore exactly."""

import json
import math
import os
import socket
import sys

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from conftest import leaves_like_a_launched_rank
from safetensors.torch import load_file, save_file

from agentrl.actor.single import SingleActor
from agentrl.config import OptimConfig
from agentrl.losses.policy import aggregation_weights
from agentrl.metrics import LossOutputs
from agentrl.models import load_model, load_tokenizer
from agentrl.packing import TrainSample, micro_batches

# Adam's first step is lr x sign(g) where |g| >> eps: float noise in tiny gradients moves an
# element by up to 2 lr, so lr is small and the gradient scale is checked through grad_norm.
OPTIM = OptimConfig(lr=1e-4, weight_decay=0.01)


def batch_samples():
    g = torch.Generator().manual_seed(0)
    samples = []
    for i in range(6):
        prompt = torch.randint(5, 200, (4 + i,), generator=g).tolist()
        response = torch.randint(5, 200, (2 + i % 3,), generator=g).tolist()
        samples.append(TrainSample.from_turn(prompt, response, advantages=[(-1.0) ** i * (1 + i / 10)] * len(response)))
    weights = aggregation_weights([s.n_targets for s in samples], "token-mean")  # global counts
    for s, w in zip(samples, weights):
        s.weight = [w] * s.n_targets
    return samples


def make_loss(actor):
    def loss_fn(batch):
        logp, _ = actor.token_logprobs(batch)
        loss = -(batch.weight * batch.advantages * logp).sum()
        return LossOutputs(loss, counts={"tokens": torch.tensor(float(batch.n_tokens))})
    return loss_fn


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def join_group(rank: int, world: int, port: int) -> None:
    """This process as rank `rank` of a gloo group of `world` on 127.0.0.1:`port`."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank))
    dist.init_process_group("gloo", rank=rank, world_size=world)


def policy(model_dir, lora):
    torch.manual_seed(0)
    model = load_model(model_dir)
    if lora:
        from agentrl.actor import LoRAConfig
        from agentrl.models import add_lora
        model = add_lora(model, LoRAConfig(r=4, alpha=8))
    return model


def make_actor(backend, model, optim=OPTIM):
    if backend == "fsdp2":
        from agentrl.actor.fsdp import FSDPActor
        return FSDPActor(model, optim)
    from agentrl.actor.deepspeed import DeepSpeedActor
    return DeepSpeedActor(model, optim, stage=int(backend[-1]))


@leaves_like_a_launched_rank
def actor_rank(rank, world, port, model_dir, out_dir, lora, backend):
    join_group(rank, world, port)
    try:
        actor = make_actor(backend, policy(model_dir, lora))
        mine = batch_samples()[rank::world]  # each rank its share; weights use the global counts
        # Rank 1 packs its share into more micro-batches than rank 0 (uneven counts are padded).
        budget = 10**6 if rank == 0 else 1
        metrics = actor.optimizer_step([(micro_batches(mine, budget), make_loss(actor))]).report(1, 1)
        state = actor.full_state_dict()
        if rank == 0:
            save_file({k: v.contiguous() for k, v in state.items()}, f"{out_dir}/fsdp.safetensors")
            torch.save({"tokens": metrics["tokens"], "grad_norm": metrics["grad_norm"]}, f"{out_dir}/metrics.pt")
        actor.save(f"{out_dir}/ckpt")
        # A second step, then restore the checkpoint: the weights are those after step one.
        actor.optimizer_step([(micro_batches(mine, 10**6), make_loss(actor))])
        actor.load(f"{out_dir}/ckpt")
        restored = actor.full_state_dict()
        assert all(torch.equal(restored[k], state[k]) for k in state)
        sampler_sees_the_update(actor, model_dir, lora)
    finally:
        dist.destroy_process_group()


def sampler_sees_the_update(actor, model_dir, lora):
    """A sharded actor's sampler holds a full copy: after the push, the log-probs it gives its own
    samples are the actor's, and measurably not those of a copy that missed the push."""
    from agentrl.packing import collate
    from agentrl.forward import response_logprobs
    from agentrl.config import SamplingConfig
    from agentrl.sampler.hf import HFSampler

    tokenizer = load_tokenizer(model_dir)
    pushed, stale = HFSampler(policy(model_dir, lora), tokenizer), HFSampler(policy(model_dir, lora), tokenizer)
    pushed.update_weights(actor.weights())
    torch.manual_seed(1)
    prompts = [list(range(5, 17)), list(range(40, 49))]
    gens = pushed.generate(prompts, SamplingConfig(temperature=1.0, max_new_tokens=6))
    batch = collate([TrainSample.from_turn(p, g.token_ids, old_logprobs=g.logprobs) for p, g in zip(prompts, gens)],
                    tokenizer.pad_token_id)
    with torch.no_grad():
        actor_logp, _ = actor.token_logprobs(batch)
        stale_logp, _ = response_logprobs(stale.model, batch)
    torch.testing.assert_close(batch.old_logprobs, actor_logp.detach().cpu(), atol=2e-4, rtol=0)
    if not lora:  # one LoRA step from B = 0 moves the log-probs by less than the tolerance
        assert (stale_logp - actor_logp.cpu()).abs().max() > 2e-3


@leaves_like_a_launched_rank
def skip_rank(rank, world, port, model_dir, backend):
    join_group(rank, world, port)
    try:
        actor = make_actor(backend, policy(model_dir, False), OptimConfig(lr=1e-4, warmup_steps=3))
        mine = batch_samples()[rank::world]
        before, lr = actor.full_state_dict(), actor.scheduler.get_last_lr()

        def nan_on_rank_1(batch):  # one rank's non-finite loss makes the global gradient norm non-finite
            out = make_loss(actor)(batch)
            out.loss = out.loss * (float("nan") if rank == 1 else 1.0)
            return out

        metrics = actor.optimizer_step([(micro_batches(mine, 10**6), nan_on_rank_1)]).report(1, 1)
        assert metrics["skipped_updates"] == 1 and not math.isfinite(metrics["grad_norm"])
        after = actor.full_state_dict()
        assert all(torch.equal(before[k], after[k]) for k in before)  # weights untouched
        assert actor.scheduler.get_last_lr() == lr  # the warm-up did not advance
        metrics = actor.optimizer_step([(micro_batches(mine, 10**6), make_loss(actor))]).report(1, 1)  # and training goes on
        assert metrics["skipped_updates"] == 0 and math.isfinite(metrics["grad_norm"])
        after = actor.full_state_dict()
        assert all(torch.isfinite(v).all() for v in after.values()) and any(
            not torch.equal(before[k], after[k]) for k in before)
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("backend", ["fsdp2", "zero2", "zero3"])
def test_a_non_finite_update_is_skipped_and_counted_by_every_sharded_backend(tiny_model_dir, backend):
    if backend.startswith("zero"):
        pytest.importorskip("deepspeed")
    mp.spawn(skip_rank, args=(2, free_port(), str(tiny_model_dir), backend), nprocs=2)


@leaves_like_a_launched_rank
def clip_and_score_rank(rank, world, port, model_dir):
    join_group(rank, world, port)
    try:
        from agentrl.actor.fsdp import FSDPActor
        # A clip far below the gradient's norm: Adam's step lr * g / (|g| + eps) shrinks to nothing
        # (no weight decay), where a clip at 1 would move every element by about lr.
        actor = FSDPActor(policy(model_dir, False), OptimConfig(lr=1e-4, weight_decay=0.0, grad_clip=1e-12))
        mine = batch_samples()[rank::world]
        before = actor.full_state_dict()
        metrics = actor.optimizer_step([(micro_batches(mine, 10**6), make_loss(actor))]).report(1, 1)
        after = actor.full_state_dict()
        assert metrics["grad_norm"] > 1e-6 and metrics["skipped_updates"] == 0
        assert max(float((after[k] - before[k]).abs().max()) for k in before) < 1e-6
        # Ranks score different numbers of batches (the shorter one runs padding repeats): each
        # gets its own batches' log-probs only.
        batches = micro_batches(mine, 1)[:1 + 2 * rank]
        scores = actor.score_logprobs(batches)
        assert len(scores) == len(batches) == 1 + 2 * rank
    finally:
        dist.destroy_process_group()


def test_fsdp2_clips_at_the_recipes_norm_and_scores_each_ranks_own_batches(tiny_model_dir):
    mp.spawn(clip_and_score_rank, args=(2, free_port(), str(tiny_model_dir)), nprocs=2)


def untied_copy(model_dir, out) -> str:
    """The model with an output layer of its own (the embeddings' values plus noise), its
    vocabulary padded to 1,024 rows so that each matrix is past the 1e5 elements below which
    ZeRO-3 keeps a parameter whole on every rank."""
    model = load_model(model_dir)
    model.resize_token_embeddings(1024)
    model.config.tie_word_embeddings = False
    torch.manual_seed(0)
    with torch.no_grad():
        model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight + 0.02 * torch.randn_like(model.lm_head.weight))
    model.save_pretrained(out)
    load_tokenizer(model_dir).save_pretrained(out)
    reloaded = load_model(str(out))
    assert reloaded.lm_head.weight.data_ptr() != reloaded.model.embed_tokens.weight.data_ptr()
    return str(out)


@pytest.mark.parametrize("backend,lora,tied", [("fsdp2", False, True), ("fsdp2", True, True), ("zero2", False, True),
                                               ("zero3", False, True), ("zero3", False, False)],
                         ids=["fsdp2", "fsdp2-lora", "zero2", "zero3", "zero3-untied"])
def test_two_ranks_match_one_process(tiny_model_dir, tmp_path, backend, lora, tied):
    """(Untied: ZeRO-3 gathers the output layer, used outside its own module, for the root's forward.)"""
    if lora:
        pytest.importorskip("peft")
    if backend.startswith("zero"):
        pytest.importorskip("deepspeed")
    if not tied:
        tiny_model_dir = untied_copy(tiny_model_dir, tmp_path / "untied")
    mp.spawn(actor_rank, args=(2, free_port(), str(tiny_model_dir), str(tmp_path), lora, backend), nprocs=2)

    model = policy(str(tiny_model_dir), lora)
    actor = SingleActor(model, OPTIM)
    metrics = actor.optimizer_step([(micro_batches(batch_samples(), 10**6), make_loss(actor))]).report(1, 1)
    fsdp = load_file(tmp_path / "fsdp.safetensors")
    single = dict(model.state_dict())
    assert set(fsdp) <= set(single)
    for name, value in fsdp.items():
        assert torch.allclose(value, single[name], atol=2e-5, rtol=0), name
    initial = policy(str(tiny_model_dir), lora).state_dict()
    moved = {k for k in fsdp if not torch.equal(fsdp[k], initial[k])}
    assert moved and (not lora or all("lora_" in k for k in moved))  # LoRA: only adapters train
    saved = torch.load(tmp_path / "metrics.pt", weights_only=True)
    assert saved["tokens"] == metrics["tokens"]  # summed over ranks
    assert saved["grad_norm"] == pytest.approx(metrics["grad_norm"], rel=1e-5)
    # The checkpoint's HF folder loads as a plain model (LoRA: after `agentrl export`).
    if lora:
        from agentrl.models import export_model
        export_model(tmp_path / "ckpt", tmp_path / "merged", str(tiny_model_dir))
        assert load_model(str(tmp_path / "merged")) is not None
    else:
        reloaded = load_model(str(tmp_path / "ckpt" / "model"))
        for name, value in reloaded.state_dict().items():
            if name in fsdp:
                assert torch.equal(value, fsdp[name]), name


@leaves_like_a_launched_rank
def checkpointing_rank(rank, world, port, model_dir, backend):
    join_group(rank, world, port)
    try:
        from agentrl.actor import FSDP2ActorConfig, ZeRO3ActorConfig
        from agentrl.registry import ACTORS

        kind = {"fsdp2": FSDP2ActorConfig, "zero3": ZeRO3ActorConfig}[backend]
        states, calls = {}, {}
        for checkpointing in (False, True):
            model = policy(model_dir, False)
            actor = ACTORS.get(backend)(kind(activation_checkpointing=checkpointing), model, OPTIM, [])
            counted = []
            model.model.layers[0].register_forward_pre_hook(lambda *_: counted.append(1))  # (a recompute stops early)
            actor.optimizer_step([(micro_batches(batch_samples()[rank::world], 10**6), make_loss(actor))])
            states[checkpointing], calls[checkpointing] = actor.full_state_dict(), len(counted)
        assert calls == {False: 1, True: 2}, calls
        for name, value in states[False].items():
            torch.testing.assert_close(states[True][name], value, atol=1e-7, rtol=0)
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("backend", ["fsdp2", "zero3"])
def test_activation_checkpointing_runs_each_layer_again_on_every_rank_with_the_same_update(tiny_model_dir, backend):
    """`actor.activation_checkpointing` on a sharded actor (as the registry builds it): each rank
    runs each decoder layer's forward once more in backward, and the update is the one without it."""
    if backend.startswith("zero"):
        pytest.importorskip("deepspeed")
    mp.spawn(checkpointing_rank, args=(2, free_port(), str(tiny_model_dir), backend), nprocs=2)


@leaves_like_a_launched_rank
def offload_rank(rank, world, port, model_dir, backend):
    join_group(rank, world, port)
    try:
        from agentrl.actor import FSDP2ActorConfig, ZeRO2ActorConfig, ZeRO3ActorConfig, fsdp
        from agentrl.registry import ACTORS

        kind = {"fsdp2": FSDP2ActorConfig, "zero2": ZeRO2ActorConfig, "zero3": ZeRO3ActorConfig}[backend]
        shard, states, offloaded = fsdp.fully_shard, {}, {}
        for offload in (False, True):
            policies = []

            def spy(module, **options):  # the real fully_shard, its policy noted
                policies.append(type(options.get("offload_policy")).__name__)
                return shard(module, **options)
            fsdp.fully_shard = spy
            model = policy(model_dir, False)
            actor = ACTORS.get(backend)(kind(cpu_offload=offload), model, OPTIM, [])
            actor.optimizer_step([(micro_batches(batch_samples()[rank::world], 10**6), make_loss(actor))])
            states[offload] = actor.full_state_dict()
            offloaded[offload] = (set(policies) if backend == "fsdp2" else
                                  {actor.engine.zero_offload_optimizer() is not None,
                                   actor.engine.zero_offload_param() is not None or backend == "zero2"})
        fsdp.fully_shard = shard
        assert offloaded == ({False: {"NoneType"}, True: {"CPUOffloadPolicy"}} if backend == "fsdp2" else
                             {False: {False, backend == "zero2"}, True: {True}}), offloaded
        for name, value in states[False].items():
            torch.testing.assert_close(states[True][name], value, atol=1e-6, rtol=0)
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("backend", ["fsdp2", "zero2", "zero3"])
def test_cpu_offload_reaches_the_sharded_actor_and_keeps_its_update(tiny_model_dir, backend):
    """`actor.cpu_offload` on a sharded actor as the registry builds it: FSDP2 shards every unit
    with CPU offloading (pinned memory only where CUDA is: on a CPU-only machine pinning fails),
    DeepSpeed offloads the optimizer (and with ZeRO-3 the parameters); the update is the one
    without it."""
    if backend.startswith("zero"):
        pytest.importorskip("deepspeed")
    mp.spawn(offload_rank, args=(2, free_port(), str(tiny_model_dir), backend), nprocs=2)


@leaves_like_a_launched_rank
def waiting_rank(rank, world, port):
    import time
    from datetime import timedelta

    from agentrl.distributed import init_from_env

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank))
    init_from_env(timeout=timedelta(seconds=3))
    try:
        if rank == 0:
            time.sleep(12)  # rank 0 busy past the other's wait
        start = time.monotonic()
        try:
            dist.barrier()
            waited = None
        except RuntimeError:
            waited = time.monotonic() - start
        if rank == 1:
            assert waited is not None and waited < 10, waited  # gave up after its 3 s, not torch's 30 min
    finally:
        dist.destroy_process_group()


def test_the_launch_waits_for_rank_0_as_long_as_it_is_told():
    """`init_from_env(timeout)` (the pipeline's 24 hours while rank 0 runs the phases before RL):
    a rank waiting at a collective gives up after that timeout, here 3 s, not torch's default."""
    mp.spawn(waiting_rank, args=(2, free_port()), nprocs=2)


class PeakResidentMemory:
    """This process's peak resident memory (VmRSS: its tensors, and the pages of any file it maps)
    above its level at start, polled every 2 ms."""

    def __init__(self):
        import threading
        self.start = self.peak = self.now()
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._poll, daemon=True)
        self.thread.start()

    @staticmethod
    def now() -> int:
        for line in open("/proc/self/status"):
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise RuntimeError("no VmRSS in /proc/self/status")

    def _poll(self):
        while not self.done.wait(0.002):
            self.peak = max(self.peak, self.now())

    def stop(self) -> int:
        self.done.set()
        self.thread.join()
        return max(self.peak, self.now()) - self.start


@leaves_like_a_launched_rank
def startup_rank(rank, world, port, model_dir, out_dir, empty):
    join_group(rank, world, port)
    try:
        from agentrl.actor import FSDP2ActorConfig, shards_on_load
        meter = PeakResidentMemory()
        actor = make_actor("fsdp2", load_model(model_dir, empty=empty and shards_on_load(FSDP2ActorConfig())))
        peak = meter.stop()
        state = actor.full_state_dict()
        if rank == 0:
            file = load_file(f"{model_dir}/model.safetensors")
            assert set(file) <= set(state) and all(torch.equal(state[k], file[k]) for k in file)
        with open(f"{out_dir}/rank{rank}-{'shards' if empty else 'whole'}.json", "w") as f:
            json.dump({"peak_bytes": peak}, f)
    finally:
        dist.destroy_process_group()


def test_fsdp2_ranks_start_with_their_shards_not_the_whole_model(tmp_path):
    """Built on the meta device and filled with each rank's rows only: a rank's peak memory at
    start is about half the model's bytes on 2 ranks, where loading it whole first costs more than
    all of them (measured side by side); the sharded weights are the file's, bit for bit."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(vocab_size=4096, hidden_size=1024, intermediate_size=2816, num_hidden_layers=4,
                                         num_attention_heads=16, num_key_value_heads=4, tie_word_embeddings=True))
    model.save_pretrained(tmp_path / "model")
    size = sum(p.numel() * p.element_size() for p in model.parameters())
    del model
    for empty in (True, False):
        mp.spawn(startup_rank, args=(2, free_port(), str(tmp_path / "model"), str(tmp_path), empty), nprocs=2)
    peaks = {name: [json.loads((tmp_path / f"rank{r}-{name}.json").read_text())["peak_bytes"] / size for r in (0, 1)]
             for name in ("shards", "whole")}
    print(f"peak memory at start per rank / model bytes ({size / 2**20:.0f} MiB): {peaks}")
    assert all(0.4 < p < 0.7 for p in peaks["shards"]), peaks
    assert all(p > 1.0 for p in peaks["whole"]), peaks


def write_recipe(path, run_dir, steps, backend="fsdp2"):
    import yaml
    from conftest import COMPACT
    path.write_text(yaml.safe_dump({
        "seed": 3, "run_dir": str(run_dir),
        "env": {"type": "household", "max_steps": 3},
        "prompt": {"template": COMPACT, "history_length": 1},
        "sampling": {"max_new_tokens": 8},
        "rl": {"steps": steps, "tasks_per_step": 2, "group_size": 3, "mini_batch_size": 8, "micro_batch_tokens": 600,
               "save_every": 1, "keep_last": 5, "actor": {"backend": backend},
               # Warm-up: the learning rate changes every step, so a resume that restarts the
               # scheduler shows in the numbers.
               "optim": {"lr": 1e-2, "warmup_steps": 3},
               # An untrained model fails every episode (all advantages 0): the entropy bonus
               # gives every step a real gradient, so a bad resume shows in the numbers.
               "entropy_coef": 0.05},
        "eval": {"episodes": 2, "splits": ["l0"]},
    }))


def torchrun(recipe, model_dir, log, resume=False, command="train", *args, nproc=2):
    import subprocess
    import sys
    from pathlib import Path

    agentrl = str(Path(sys.executable).parent / "agentrl")
    launch = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc), "--master_port",
              str(free_port()), "--no-python", agentrl] if nproc else [agentrl]
    return subprocess.Popen([*launch, command, str(recipe), "--model", str(model_dir), *args,
                             *(["--resume"] if resume else [])],
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONFAULTHANDLER": "1"})


def kill_launch(proc) -> None:
    """SIGKILL a torchrun launch: its ranks (each started in a session of its own), then torchrun."""
    import signal
    import subprocess

    ranks = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()
    for pid in ranks:
        os.kill(int(pid), signal.SIGKILL)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert len(ranks) == 2


@pytest.mark.parametrize("backend", ["fsdp2", "zero3"])
def test_two_rank_training_killed_and_resumed_matches_an_uninterrupted_run(tiny_model_dir, tmp_path, backend):
    if backend.startswith("zero"):
        pytest.importorskip("deepspeed")
    import random
    import time

    from agentrl.checkpoint import list_checkpoints
    from agentrl.tracking import read_metrics

    def rows(run_dir):
        return [{k: v for k, v in r.items() if not k.startswith(("timing_s/", "throughput/", "eval/"))}
                for r in read_metrics(run_dir / "rl" / "logs" / "metrics.jsonl")]

    with open(tmp_path / "straight.log", "w") as log:
        write_recipe(tmp_path / "a.yaml", tmp_path / "a", 3, backend)
        assert torchrun(tmp_path / "a.yaml", tiny_model_dir, log).wait(timeout=600) == 0, \
            (tmp_path / "straight.log").read_text()
    straight = tmp_path / "a"
    assert [r["step"] for r in rows(straight)] == [1, 2, 3]
    checkpoint = list_checkpoints(straight / "rl")[-1]
    assert (checkpoint / ("dcp" if backend == "fsdp2" else "ds")).is_dir()
    assert (checkpoint / "model" / "model.safetensors").is_file()
    from agentrl.rollout.records import read_trajectories
    saved = read_trajectories(straight / "rl" / "rollouts" / "step_000003.jsonl.gz")
    assert sorted(t.group_id for t in saved) == [4, 4, 4, 5, 5, 5]  # both ranks' episodes of step 3

    # The same run, SIGKILLed (every rank at once) after a random checkpoint, then resumed.
    write_recipe(tmp_path / "b.yaml", tmp_path / "b", 3, backend)
    kill_after = random.Random().choice([1, 2])
    with open(tmp_path / "killed.log", "w") as log:
        proc = torchrun(tmp_path / "b.yaml", tiny_model_dir, log)
        deadline = time.time() + 600
        target = tmp_path / "b" / "rl" / "checkpoints" / f"step_{kill_after:06d}"
        while not target.exists():
            assert proc.poll() is None and time.time() < deadline, (tmp_path / "killed.log").read_text()
            time.sleep(0.02)
        kill_launch(proc)
    assert list_checkpoints(tmp_path / "b" / "rl")[-1].name != "step_000003", "the kill came too late"
    with open(tmp_path / "resumed.log", "w") as log:
        assert torchrun(tmp_path / "b.yaml", tiny_model_dir, log, resume=True).wait(timeout=600) == 0, \
            (tmp_path / "resumed.log").read_text()
    assert all(r["actor/grad_norm"] > 0 for r in rows(straight))
    assert rows(tmp_path / "b") == rows(straight), f"killed after step {kill_after}"
    final_a = load_file(checkpoint / "model" / "model.safetensors")
    final_b = load_file(list_checkpoints(tmp_path / "b" / "rl")[-1] / "model" / "model.safetensors")
    assert all(torch.equal(final_a[k], final_b[k]) for k in final_a)


@pytest.mark.parametrize("backend,lora", [("fsdp2", False), ("fsdp2", True), ("zero3", False)],
                         ids=["fsdp2", "fsdp2-lora", "zero3"])
def test_sharded_sft_matches_one_process_and_resumes_exactly_after_a_kill(tiny_model_dir, tmp_path, backend, lora):
    """`agentrl sft` on 2 gloo ranks trains the weights one process trains from the same global
    batches; (fsdp2) SIGKILLed after a random checkpoint and rerun, it ends bit for bit where an
    uninterrupted 2-rank run ends, with the same logged losses."""
    if lora:
        pytest.importorskip("peft")
    if backend.startswith("zero"):
        pytest.importorskip("deepspeed")
    import random
    import time

    import yaml
    from conftest import COMPACT

    from agentrl.config import PromptConfig
    from agentrl.data import collect_expert_data
    from agentrl.envs import make_env
    from agentrl.envs.household.env import HouseholdEnvConfig
    from agentrl.tracking import read_metrics

    prompt = {"template": COMPACT, "history_length": 1}
    collect_expert_data(make_env(HouseholdEnvConfig()), PromptConfig(**prompt), 3, tmp_path / "data.jsonl", 0)

    def sft(name, actor, kill_after=None):
        recipe = tmp_path / f"{name}.yaml"
        recipe.write_text(yaml.safe_dump({
            "seed": 5, "prompt": prompt, "sft": {"epochs": 2, "batch_size": 8, "save_every": 1, "micro_batch_tokens": 400,
                                                 "optim": {"lr": 1e-4}, "actor": actor}}))
        out = tmp_path / name / "model"
        with open(tmp_path / f"{name}.log", "a") as log:
            proc = torchrun(recipe, tiny_model_dir, log, False, "sft", "--data", str(tmp_path / "data.jsonl"),
                            "--out", str(out), nproc=0 if actor["backend"] == "single" else 2)
            if kill_after is None:
                assert proc.wait(timeout=600) == 0, (tmp_path / f"{name}.log").read_text()[-3000:]
                return out
            deadline = time.time() + 600
            target = tmp_path / name / "model.tmp" / "checkpoints" / f"step_{kill_after:06d}"
            while not target.exists():
                assert proc.poll() is None and time.time() < deadline, (tmp_path / f"{name}.log").read_text()
                time.sleep(0.02)
            kill_launch(proc)
            assert not out.exists()  # the output appears only when complete

    adapters = {"lora": {"r": 4, "alpha": 8}} if lora else {}
    one = load_file(sft("one", {"backend": "single", **adapters}) / "model.safetensors")
    two = load_file(sft("two", {"backend": backend, **adapters}) / "model.safetensors")
    initial = load_file(tiny_model_dir / "model.safetensors")
    tied = {"lm_head.weight"}  # a tied head is written by the sharded actors only
    assert set(one) - tied == set(two) - tied == set(initial) - tied  # LoRA: merged into plain weights
    assert max(float((two[k] - initial[k]).abs().max()) for k in set(two) - tied) > 2e-4  # it trained
    for name in set(one) & set(two):
        assert torch.allclose(one[name], two[name], atol=5e-5, rtol=0), name
    logged = {name: read_metrics(tmp_path / name / "model" / "logs" / "metrics.jsonl") for name in ("one", "two")}
    losses = [r["sft/loss"] for r in logged["two"]]
    assert losses == pytest.approx([r["sft/loss"] for r in logged["one"]], rel=1e-4)
    # AdamW's step barely depends on the gradient's scale: the norm shows a wrong one
    assert [r["sft/grad_norm"] for r in logged["two"]] == pytest.approx([r["sft/grad_norm"] for r in logged["one"]],
                                                                        rel=1e-4)
    assert not (tmp_path / "two" / "model" / "checkpoints").exists() and not (tmp_path / "two" / "model.tmp").exists()
    if backend != "fsdp2" or lora:
        return

    steps = len(losses)
    kill_after = random.Random().randrange(1, steps)
    sft("killed", {"backend": backend}, kill_after=kill_after)
    resumed = load_file(sft("killed", {"backend": backend}) / "model.safetensors")
    assert "sft continuing from step_" in (tmp_path / "killed.log").read_text()
    assert all(torch.equal(resumed[k], two[k]) for k in two), f"killed after step {kill_after}"
    rows = read_metrics(tmp_path / "killed" / "model" / "logs" / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(1, steps + 1))
    assert [r["sft/loss"] for r in rows] == losses


def test_accelerate_launch_with_the_cpu_config_runs_the_pipeline_on_two_ranks(tiny_model_dir, tmp_path):
    """`accelerate launch --config_file recipes/accelerate/cpu.yaml --no_python agentrl run`: 2 gloo
    ranks run the pipeline (SFT and RL sharded); `accelerate launch --cpu` (one process) is refused
    with the form that works, before anything loads."""
    import subprocess
    import sys
    from pathlib import Path

    import yaml

    pytest.importorskip("accelerate")
    accelerate = str(Path(sys.executable).parent / "accelerate")
    agentrl = str(Path(sys.executable).parent / "agentrl")
    root = Path(__file__).resolve().parents[1]
    write_recipe(tmp_path / "r.yaml", tmp_path / "run", 1)
    recipe = yaml.safe_load((tmp_path / "r.yaml").read_text())
    recipe.update(model={"path": str(tiny_model_dir)}, sft={"episodes": 2, "epochs": 1, "batch_size": 8},
                  eval={"episodes": 1, "splits": ["l0"]})
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(recipe))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([accelerate, "launch", "--config_file", str(root / "recipes" / "accelerate" / "cpu.yaml"),
                           "--main_process_port", str(free_port()), "--no_python", agentrl, "run",
                           str(tmp_path / "r.yaml")], capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "RL step 1/1" in done.stdout and (tmp_path / "run" / "rl" / "checkpoints" / "step_000001").is_dir()
    assert list(json.loads((tmp_path / "run" / "summary.json").read_text())["phases"]) == ["initial", "sft", "rl"]
    assert json.loads((tmp_path / "run" / "phases.json").read_text())["sft"]["sft.actor.backend"] == "fsdp2"
    from agentrl.rollout.records import read_trajectories
    assert len(read_trajectories(tmp_path / "run" / "rl" / "rollouts" / "step_000001.jsonl.gz")) == 6  # both ranks'

    done = subprocess.run([accelerate, "launch", "--cpu", "--num_processes", "2", "--no_python", agentrl, "run",
                           str(tmp_path / "r.yaml")], capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode != 0
    assert "`accelerate launch --cpu` starts one process" in done.stderr and "recipes/accelerate/cpu.yaml" in done.stderr


def test_the_pipeline_under_torchrun_shards_sft_and_rl_and_resumes_after_kills(tmp_path):
    """`torchrun ... agentrl run`: rank 0 makes the model, evaluates and collects expert data while
    rank 1 waits; both train SFT and RL (fsdp2). SIGKILLed in SFT, then in RL, each rerun of the
    same command continues from the last checkpoint; rank 0 writes the summary; a rerun reuses
    every phase."""
    import subprocess
    import sys
    import time
    from pathlib import Path

    import yaml
    from conftest import COMPACT

    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump({
        "seed": 1, "run_dir": str(tmp_path / "run"), "model": {"path": str(tmp_path / "run" / "init")},
        "init": {"layers": 1, "intermediate_size": 128, "corpus_episodes": 20},
        "env": {"type": "household", "max_steps": 10}, "prompt": {"template": COMPACT, "history_length": 1},
        "sampling": {"max_new_tokens": 8}, "sft": {"episodes": 3, "epochs": 2, "batch_size": 8, "save_every": 1},
        "rl": {"steps": 3, "tasks_per_step": 2, "group_size": 2, "save_every": 1, "actor": {"backend": "fsdp2"}},
        "eval": {"episodes": 2, "splits": ["l0"]},
    }))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}

    def command(*overrides):
        return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
                str(free_port()), "--no-python", str(Path(sys.executable).parent / "agentrl"), "run", str(recipe),
                *overrides]

    def launch(*overrides):
        return subprocess.run(command(*overrides), capture_output=True, text=True, timeout=600, env=env)

    def killed_at(path: Path) -> str:
        with open(tmp_path / "killed.log", "w") as log:
            proc = subprocess.Popen(command(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env)
            deadline = time.time() + 600
            while not path.exists():
                assert proc.poll() is None and time.time() < deadline, (tmp_path / "killed.log").read_text()
                time.sleep(0.02)
            kill_launch(proc)
        return (tmp_path / "killed.log").read_text()

    run = tmp_path / "run"
    sft_checkpoint = run / "sft" / "model.tmp" / "checkpoints" / "step_000001"
    killed_at(sft_checkpoint)
    assert (sft_checkpoint / "dcp").is_dir()  # both ranks wrote their SFT shards
    assert not (run / "sft" / "model").exists()
    log = killed_at(run / "rl" / "checkpoints" / "step_000001")
    assert "sft continuing from step_000001" in log
    assert (run / "sft" / "model" / "config.json").is_file() and not (run / "sft" / "model.tmp").exists()

    done = launch()
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "rl continuing from step_000001 to step 3" in done.stdout
    summary = json.loads((run / "summary.json").read_text())
    assert list(summary["phases"]) == ["initial", "sft", "rl"]
    assert done.stdout.count("Success rate") == 1  # rank 0 only
    from agentrl.rollout.records import read_trajectories
    assert len(read_trajectories(run / "rl" / "rollouts" / "step_000003.jsonl.gz")) == 4  # both ranks' episodes
    assert (run / "rl" / "checkpoints" / "step_000003" / "dcp").is_dir()
    from agentrl.tracking import read_metrics
    assert [r["step"] for r in read_metrics(run / "rl" / "logs" / "metrics.jsonl")] == [0, 1, 2, 3]

    again = launch()
    assert again.returncode == 0, again.stderr[-3000:]
    assert "phase eval rl: done earlier with the same settings, reused" in again.stdout
    assert "phase sft: done earlier with the same settings, reused" in again.stdout
    assert json.loads((run / "summary.json").read_text())["phases"] == summary["phases"]

    # One process's actor on two ranks would train two models: refused.
    single = launch("--set", "rl.actor.backend=single")
    assert single.returncode != 0 and "rl.actor.backend: single trains in one process" in single.stderr
    single = launch("--set", "sft.actor.backend=single")
    assert single.returncode != 0 and "sft.actor.backend: single trains in one process" in single.stderr
    assert (run / "rl" / "checkpoints" / "step_000003").is_dir()  # refused before anything was redone


@pytest.mark.slow
@pytest.mark.timeout(3600)  # 20 launches, past the suite's per-test limit
@pytest.mark.parametrize("backend", ["fsdp2", "zero3"])
def test_twenty_short_two_rank_runs_in_a_row_exit_0_on_every_rank(tiny_model_dir, tmp_path, backend):
    """A finished run is never reported as failed: no rank aborts while the process exits (on
    SIGABRT, faulthandler prints every thread's stack to the log)."""
    if backend.startswith("zero"):
        pytest.importorskip("deepspeed")
    from agentrl.tracking import read_metrics

    recipe = tmp_path / "recipe.yaml"
    for attempt in range(20):
        write_recipe(recipe, tmp_path / f"run{attempt}", steps=1, backend=backend)
        with open(tmp_path / f"run{attempt}.log", "wb") as log:
            proc = torchrun(recipe, tiny_model_dir, log)
            code = proc.wait(timeout=600)
        text = (tmp_path / f"run{attempt}.log").read_text(errors="replace")
        assert code == 0, f"run {attempt + 1} of 20 exited {code}:\n{text[-4000:]}"
        assert [r["step"] for r in read_metrics(tmp_path / f"run{attempt}" / "rl" / "logs" / "metrics.jsonl")] == [1]
