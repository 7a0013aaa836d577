"""Data-parallel actors with real torch.distributed (gloo, 2 processes): the same global batch
gives the same update as one process, and sharded checkpoints restore exactly."""

import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from safetensors.torch import load_file, save_file

from agentrl.actor.batch import TrainSample, micro_batches
from agentrl.actor.single import SingleActor
from agentrl.config import OptimConfig
from agentrl.losses.policy import aggregation_weights
from agentrl.models import load_model

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
        s.values["agg_weight"] = [w] * s.n_targets
    return samples


def make_loss(actor):
    def loss_fn(batch):
        logp, _ = actor.token_logprobs(batch)
        loss = -(batch.values["agg_weight"] * batch.values["advantages"] * logp).sum()
        return loss, {"tokens": torch.tensor(float(batch.n_tokens))}
    return loss_fn


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def fsdp_rank(rank, world, port, model_dir, out_dir):
    from agentrl.actor.fsdp import FSDPActor

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        torch.manual_seed(0)
        actor = FSDPActor(load_model(model_dir), OPTIM)
        mine = batch_samples()[rank::world]  # each rank its share; weights use the global counts
        # Rank 1 packs its share into more micro-batches than rank 0 (uneven counts are padded).
        budget = 10**6 if rank == 0 else 1
        metrics = actor.optimizer_step([(micro_batches(mine, budget), make_loss(actor))])
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
    finally:
        dist.destroy_process_group()


def test_fsdp2_two_ranks_match_one_process(tiny_model_dir, tmp_path):
    mp.spawn(fsdp_rank, args=(2, free_port(), str(tiny_model_dir), str(tmp_path)), nprocs=2)

    model = load_model(str(tiny_model_dir))
    actor = SingleActor(model, OPTIM)
    metrics = actor.optimizer_step([(micro_batches(batch_samples(), 10**6), make_loss(actor))])
    fsdp = load_file(tmp_path / "fsdp.safetensors")
    single = dict(model.state_dict())
    assert set(fsdp) <= set(single)
    for name, value in fsdp.items():
        assert torch.allclose(value, single[name], atol=2e-5, rtol=0), name
    moved = sum(not torch.equal(fsdp[k], load_model(str(tiny_model_dir)).state_dict()[k]) for k in fsdp)
    assert moved > 0
    saved = torch.load(tmp_path / "metrics.pt", weights_only=True)
    assert saved["tokens"] == metrics["tokens"]  # summed over ranks
    assert saved["grad_norm"] == pytest.approx(metrics["grad_norm"], rel=1e-5)
    # The checkpoint's HF folder loads as a plain model.
    reloaded = load_model(str(tmp_path / "ckpt" / "model"))
    for name, value in reloaded.state_dict().items():
        if name in fsdp:
            assert torch.equal(value, fsdp[name]), name
