"""DeepSpeed ZeRO-2 / ZeRO-3 actor (`pip install 'agentrl[deepspeed]'`).

The engine wraps the same `TokenHead` root as the FSDP2 actor (decoder + fused log-prob). Under
ZeRO-3 the lm_head weight is used outside its own module's forward; DeepSpeed's parameter getter
gathers it there and registers it as an external parameter of the root itself. Gradients are
accumulated over a step's micro-batches (the accumulation boundary is set by hand: the count
varies from step to step), averaged over ranks by DeepSpeed and therefore each rank's globally
normalised loss is scaled by the world size, as in `actor/fsdp.py`; ranks pad to the same
micro-batch count. The optimizer is torch's AdamW (the same update as the other backends),
partitioned by ZeRO. On CPU the process group is gloo (DeepSpeed's default ccl backend does not
run there).
Checkpoints are DeepSpeed's own sharded format (`ds/`) plus a plain HF folder (`model/`).
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
import torch.distributed as dist

from agentrl.actor.base import backward_all, update_metrics
from agentrl.actor.fsdp import TokenHead, call_root, padded_scores, padded_work, write_plain_copy
from agentrl.actor.base import make_optimizer
from agentrl.distributed import device
from agentrl.errors import RunError
from agentrl.metrics import LossOutputs, Tally


class DeepSpeedActor:
    def __init__(self, model, optim, stage: int, mixed_precision: bool = True, cpu_offload: bool = False,
                 activation_checkpointing: bool = False):
        import deepspeed

        if not dist.is_initialized():
            raise RuntimeError("the deepspeed actor needs torch.distributed (launch with torchrun or accelerate launch)")
        deepspeed.init_distributed(dist_backend=dist.get_backend())
        self.model, self.world = model, dist.get_world_size()
        if activation_checkpointing:
            model.gradient_checkpointing_enable()
        root = TokenHead(model)
        zero = {"stage": stage}
        if cpu_offload:  # the step is torch's AdamW on CPU (DeepSpeed asks for its own CPU Adam, a compiled op)
            zero["offload_optimizer"] = {"device": "cpu"}
            if stage == 3:
                zero["offload_param"] = {"device": "cpu"}
        config = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
                  "gradient_clipping": optim.grad_clip, "zero_optimization": zero,
                  "zero_allow_untested_optimizer": True, "zero_force_ds_cpu_optimizer": False,
                  # A non-finite gradient norm skips the step (ZeRO checks it for fp32; bf16 on this flag).
                  "bf16": {"enabled": bool(mixed_precision and torch.cuda.is_available()), "check_grad_overflow": True}}
        trainable = [p for p in root.parameters() if p.requires_grad]
        optimizer, scheduler = make_optimizer(trainable, optim)
        self.engine, self.optimizer, _, self.scheduler = deepspeed.initialize(
            model=root, optimizer=optimizer, lr_scheduler=scheduler, config=config, dist_init_required=False)

    def token_logprobs(self, batch, temperature=1.0, entropy=False):
        return call_root(self.engine, batch, temperature, entropy)

    def score_logprobs(self, batches, temperature=1.0):
        return padded_scores(self, batches, temperature)

    def token_hidden(self, batch):
        return call_root(self.engine, batch, hidden=True)

    def _backward(self, loss: torch.Tensor, last: bool) -> None:
        self.engine.set_gradient_accumulation_boundary(last)
        self.engine.backward(loss * self.world)

    def _idle_loss(self, batch):
        return LossOutputs(self.token_logprobs(batch)[0].sum())

    def optimizer_step(self, parts) -> Tally:
        self.engine.train()
        lr = self.scheduler.get_last_lr()[0]
        tally = backward_all(padded_work(parts, self._idle_loss), device(), self._backward)
        self.engine.step()
        skipped = not self.engine.was_step_applied()  # a non-finite norm: gradients dropped, scheduler not stepped
        grad_norm = self.engine.get_global_grad_norm()  # before clipping
        grad_norm = float("inf") if skipped else float(grad_norm if grad_norm is not None else 0.0)
        if not skipped and not math.isfinite(grad_norm):  # applied all the same: stop now
            raise RunError(f"a non-finite gradient norm ({grad_norm}) reached the DeepSpeed optimiser, which "
                           f"applied it: resume from the last checkpoint with a lower rl.optim.lr")
        return tally.over_ranks().add(update_metrics(lr, grad_norm, skipped))

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """The unsharded weights on every rank, named as in the plain HF model."""
        import deepspeed
        params = dict(self.engine.module.named_parameters())
        with deepspeed.zero.GatheredParameters(list(params.values()), modifier_rank=None):
            state = {k: v.detach().clone() for k, v in self.engine.module.state_dict().items()}
        return {k.removeprefix("model."): v for k, v in state.items()}

    def weights(self):
        """(name, full tensor) one parameter at a time, each gathered (ZeRO-3) only when the
        consumer reaches it; every rank must consume the stream to the end, in order."""
        import deepspeed
        for name, param in self.engine.module.named_parameters():
            with deepspeed.zero.GatheredParameters([param], modifier_rank=None):
                yield name.removeprefix("model."), param.detach().clone()

    def save(self, path: Path) -> None:
        path = Path(path)
        self.engine.save_checkpoint(str(path / "ds"), tag="state")
        write_plain_copy(self.model, self.full_state_dict(), path / "model")  # DeepSpeed saved the scheduler
        dist.barrier()

    def load(self, path: Path) -> None:
        self.engine.load_checkpoint(str(Path(path) / "ds"), tag="state")
