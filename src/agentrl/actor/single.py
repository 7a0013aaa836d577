"""Single-process actor: one model, AdamW, constant LR with linear warmup."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file

from agentrl.actor.base import backward_all, make_optimizer, update_metrics
from agentrl.distributed import model_device
from agentrl.forward import response_logprobs, trained_hidden
from agentrl.models import is_lora
from agentrl.packing import TokenBatch


class SingleActor:
    def __init__(self, model, optim, extra_parameters=()):
        """`extra_parameters` (e.g. a classifier head of an auxiliary loss) are optimised with
        the model's; their state is in the optimizer's, their weights are saved by their owner.
        Weights in a low-precision dtype (bf16) are updated through fp32 master copies: AdamW
        steps of lr 1e-6 applied to bf16 weights would round away. The model keeps computing
        (and the sampler sharing it generating) in its own dtype."""
        self.model = model
        self.grad_clip = optim.grad_clip
        self.parameters = [*(p for p in model.parameters() if p.requires_grad), *extra_parameters]
        self.master = [p if p.dtype == torch.float32 else p.detach().float().requires_grad_() for p in self.parameters]
        self.optimizer, self.scheduler = make_optimizer(self.master, optim)

    def token_logprobs(self, batch, temperature=1.0, entropy=False):
        return response_logprobs(self.model, batch, temperature, entropy)

    @torch.no_grad()
    def score_logprobs(self, batches, temperature=1.0):
        return [self.token_logprobs(b, temperature)[0] for b in batches]

    def token_hidden(self, batch):
        return trained_hidden(self.model, batch)

    def optimizer_step(self, parts) -> Tally:
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        for p in self.parameters:
            p.grad = None
        work = [(batch, loss_fn, 1.0) for batches, loss_fn in parts for batch in batches]
        tally = backward_all(work, model_device(self.model), lambda loss, last: loss.backward())
        for p, master in zip(self.parameters, self.master):
            if master is not p:  # one fp32 gradient at a time, the bf16 one freed
                master.grad, p.grad = (None if p.grad is None else p.grad.float()), None
        grad_norm = torch.nn.utils.clip_grad_norm_(self.master, self.grad_clip)
        lr = self.scheduler.get_last_lr()[0]
        finite = bool(torch.isfinite(grad_norm))  # a non-finite loss gives a non-finite norm too
        if finite:
            self.optimizer.step()
            self.scheduler.step()
            self._copy_master()
        return tally.add(update_metrics(lr, float(grad_norm), skipped=not finite))

    @torch.no_grad()
    def _copy_master(self) -> None:
        for p, master in zip(self.parameters, self.master):
            if master is not p:
                p.copy_(master)

    def weights(self):
        return self.model.named_parameters()

    def save(self, path: Path) -> None:
        """model/ is a plain HF folder, or with LoRA a peft adapter folder (`agentrl export`
        merges it into its base); optimizer.pt holds the optimiser, the scheduler and the fp32
        master weights of low-precision parameters."""
        self.model.save_pretrained(path / "model")
        master = [m for p, m in zip(self.parameters, self.master) if m is not p]
        torch.save({"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict(),
                    "master": master}, path / "optimizer.pt")

    def load(self, path: Path) -> None:
        if is_lora(self.model):
            from peft import set_peft_model_state_dict
            result = set_peft_model_state_dict(self.model, load_file(path / "model" / "adapter_model.safetensors"))
            if result.unexpected_keys:
                raise ValueError(f"checkpoint {path} does not match the adapters: {result.unexpected_keys}")
        else:
            state = load_file(path / "model" / "model.safetensors")
            missing, unexpected = self.model.load_state_dict(state, strict=False)
            tied = {"lm_head.weight"} if self.model.config.tie_word_embeddings else set()
            if unexpected or set(missing) - tied:
                raise ValueError(f"checkpoint {path} does not match the model: missing {missing}, "
                                 f"unexpected {unexpected}")
        saved = torch.load(path / "optimizer.pt", weights_only=True)
        self.optimizer.load_state_dict(saved["optimizer"])
        self.scheduler.load_state_dict(saved["scheduler"])
        low = [(p, m) for p, m in zip(self.parameters, self.master) if m is not p]
        masters = saved.get("master") or [p.float() for p, _ in low]  # a checkpoint without: from its weights
        with torch.no_grad():
            for (_, master), value in zip(low, masters):
                master.copy_(value)
