"""FSDP2 actor: the model sharded over the data-parallel ranks with `fully_shard`.

Every decoder layer is its own FSDP unit; the root unit is `TokenHead`, whose forward runs the
decoder and the fused log-prob, so FSDP's hooks gather the root's own parameters (embeddings,
final norm, lm_head: tied or not) for exactly that computation. Gradients are *summed* over
ranks: each rank's loss is already normalised by the global token count
(`losses.policy.aggregation_weights` with all-reduced counts), so the sum is the update a single
process would make on the whole batch. (FSDP averages gradients over ranks, so each rank's loss
is scaled by the world size; gloo cannot apply a divide factor of 1 itself.) Ranks may hold different numbers of micro-batches; the
shorter ones run zero-weighted repeats so every rank makes the same collective calls.

bf16 mixed precision (parameters in bf16 for compute, fp32 reduction and master weights) on
CUDA; fp32 on CPU (gloo). `cpu_offload` keeps the sharded parameters and optimizer state in CPU
memory; `activation_checkpointing` recomputes each layer's activations in backward.
Checkpoints are torch.distributed.checkpoint (DCP) folders: each rank writes its own shards.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                     get_optimizer_state_dict, set_model_state_dict,
                                                     set_optimizer_state_dict)
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

from agentrl.actor.base import backward_all, update_metrics
from agentrl.actor.base import make_optimizer
from agentrl.distributed import device
from agentrl.forward import response_logprobs, trained_hidden
from agentrl.metrics import LossOutputs, Tally
from agentrl.models import load_shards
from agentrl.packing import LAYOUT, TokenBatch, TrainSample, collate


def idle_batch() -> TokenBatch:
    """A two-token batch for a rank with nothing to train (it still joins every collective)."""
    return collate([TrainSample([0, 0], [False, True])])


def padded_work(parts, idle_loss) -> list[tuple]:
    """(batch, loss_fn, scale) for every micro-batch, padded with zero-weighted repeats to the
    largest count over the ranks, so that every rank makes the same collective calls; a rank
    with nothing to train runs an idle batch."""
    work = [(batch, loss_fn, 1.0) for batches, loss_fn in parts for batch in batches]
    count = torch.tensor([len(work)], device=device())  # nccl reduces GPU tensors only
    dist.all_reduce(count, op=dist.ReduceOp.MAX)
    if not work:
        work = [(idle_batch(), idle_loss, 0.0)]
    return work + [(work[0][0], work[0][1], 0.0)] * (int(count) - len(work))


@torch.no_grad()
def padded_scores(actor, batches, temperature: float) -> list[torch.Tensor]:
    """A sharded actor's log-probs of `batches`, every rank running as many forward passes."""
    work = padded_work([(batches, None)], None)
    scores = [actor.token_logprobs(batch, temperature)[0] for batch, _, _ in work]
    return scores[:len(batches)]


def write_plain_copy(model, full_state: dict, folder: Path) -> None:
    """Rank 0 writes the gathered weights as a plain HF folder (or a peft adapter folder)."""
    if dist.get_rank() == 0:
        model.save_pretrained(folder, state_dict=full_state)


class TokenHead(torch.nn.Module):
    """The FSDP root: the causal LM, entered through the fused per-token computations."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, layout: tuple, temperature: float = 1.0, entropy: bool = False, hidden: bool = False):
        batch = TokenBatch(**dict(zip(LAYOUT, layout)))
        if hidden:
            return trained_hidden(self.model, batch)
        return response_logprobs(self.model, batch, temperature, entropy)


def call_root(root, batch: TokenBatch, temperature: float = 1.0, entropy: bool = False, hidden: bool = False):
    """Run a wrapped `TokenHead` (FSDP module or DeepSpeed engine) on a batch moved to this rank's device."""
    batch = batch.to(device())
    return root(batch.layout(), temperature, entropy, hidden)


class FSDPActor:
    def __init__(self, model, optim, mixed_precision: bool = True, cpu_offload: bool = False,
                 activation_checkpointing: bool = False):
        if not dist.is_initialized():
            raise RuntimeError("the fsdp2 actor needs torch.distributed (launch with torchrun or accelerate launch)")
        self.model, self.grad_clip = model, optim.grad_clip
        if activation_checkpointing:
            model.gradient_checkpointing_enable()
        options = {}
        if mixed_precision and torch.cuda.is_available():
            # fp32 master weights (and so fp32 gradients and AdamW moments), bf16 compute: a
            # model loaded in bf16 would otherwise update in bf16, where lr 1e-6 steps round away.
            model.float()
            options["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        if cpu_offload:
            options["offload_policy"] = CPUOffloadPolicy(pin_memory=torch.cuda.is_available())
        for layer in model.get_decoder().layers:
            fully_shard(layer, **options)
        self.net = fully_shard(TokenHead(model), **options)
        if any(p.is_meta for p in self.net.parameters()):  # `load_model(empty=True)`: read this rank's shards
            buffers = {name: b.clone() for name, b in self.net.named_buffers()}
            self.net.to_empty(device="cpu" if cpu_offload else device())
            for name, b in self.net.named_buffers():
                b.copy_(buffers[name])
            load_shards(self.net, model.name_or_path, prefix="model.")
        self.world = dist.get_world_size()
        self.optimizer, self.scheduler = make_optimizer([p for p in self.net.parameters() if p.requires_grad], optim)

    def token_logprobs(self, batch, temperature=1.0, entropy=False):
        return call_root(self.net, batch, temperature, entropy)

    def score_logprobs(self, batches, temperature=1.0):
        return padded_scores(self, batches, temperature)

    def token_hidden(self, batch):
        return call_root(self.net, batch, hidden=True)

    def optimizer_step(self, parts) -> Tally:
        """One update from every rank's (micro-batches, loss_fn) parts; metrics summed over ranks."""
        self.net.train()
        self.optimizer.zero_grad(set_to_none=True)
        tally = backward_all(padded_work(parts, self._idle_loss), device(), self._backward)
        grad_norm = torch.nn.utils.clip_grad_norm_([p for p in self.net.parameters() if p.requires_grad],
                                                   self.grad_clip)
        grad_norm = grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm
        lr = self.scheduler.get_last_lr()[0]
        finite = bool(torch.isfinite(grad_norm))  # the global norm: every rank decides alike
        if finite:
            self.optimizer.step()
            self.scheduler.step()
        return tally.over_ranks().add(update_metrics(lr, float(grad_norm), skipped=not finite))

    def _backward(self, loss: torch.Tensor, last: bool) -> None:
        self.net.set_requires_gradient_sync(last)
        (loss * self.world).backward()

    def _idle_loss(self, batch):
        return LossOutputs(self.token_logprobs(batch)[0].sum())

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """The unsharded weights (every rank gets them), named as in the plain HF model."""
        state = get_model_state_dict(self.net, options=StateDictOptions(full_state_dict=True))
        return {k.removeprefix("model."): v for k, v in state.items()}

    def weights(self):
        """(name, full tensor) one parameter at a time, each all-gathered only when the consumer
        (the sampler's weight push) reaches it: never a second full copy. Every rank must consume
        the stream to the end, in order (every rank's sampler does)."""
        for name, param in self.net.named_parameters():
            if param.device != device():  # cpu_offload: gather on the rank's device
                param = param.to(device())
            yield name.removeprefix("model."), param.full_tensor().detach()

    def save(self, path: Path) -> None:
        """Sharded model + optimizer state (DCP, every rank writes its shards); rank 0 also writes
        the scheduler state and a plain HF folder (model/) that AutoModel and vLLM load."""
        path = Path(path)
        dcp.save({"model": get_model_state_dict(self.net),
                  "optim": get_optimizer_state_dict(self.net, self.optimizer)}, checkpoint_id=path / "dcp")
        write_plain_copy(self.model, self.full_state_dict(), path / "model")
        if dist.get_rank() == 0:
            (path / "scheduler.json").write_text(json.dumps(self.scheduler.state_dict()))
        dist.barrier()

    def load(self, path: Path) -> None:
        path = Path(path)
        state = {"model": get_model_state_dict(self.net), "optim": get_optimizer_state_dict(self.net, self.optimizer)}
        dcp.load(state, checkpoint_id=path / "dcp")
        set_model_state_dict(self.net, state["model"])
        set_optimizer_state_dict(self.net, self.optimizer, state["optim"])
        self.scheduler.load_state_dict(json.loads((path / "scheduler.json").read_text()))
