"""Data-parallel helpers: one process per rank (torchrun / accelerate launch set RANK and
WORLD_SIZE); everything is a no-op in a single process."""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Callable, TypeVar

import torch
import torch.distributed as dist

from agentrl.errors import RunError

T = TypeVar("T")


def init_from_env(timeout: timedelta | None = None) -> None:
    """Join the process group the launcher describes (nccl on GPUs, gloo on CPU), also a group
    of one (`torchrun --nproc_per_node 1`: a sharded backend on one GPU). `timeout`: how long a
    collective waits for the slowest rank (torch's default when None)."""
    if "WORLD_SIZE" in os.environ and not dist.is_initialized():
        if torch.cuda.is_available():
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo", timeout=timeout)


def on_main(compute: Callable[[], T]) -> T:
    """compute() on rank 0, its result on every rank (the others wait); an exception on rank 0
    stops every rank (there: raised again; elsewhere: RunError naming it)."""
    if world() == 1:
        return compute()
    box = [None]
    if is_main():
        try:
            box[0] = ("ok", compute())
        except BaseException as err:
            box[0] = ("error", f"{type(err).__name__}: {err}")
            dist.broadcast_object_list(box, src=0, device=device())
            raise
    dist.broadcast_object_list(box, src=0, device=device())  # our rank 0's values, never outside input
    status, value = box[0]
    if status == "error":
        raise RunError(f"rank 0 stopped ({value})")
    return value


def shutdown() -> None:
    """Leave the process group once every rank is done. Left to interpreter exit, gloo's threads
    can be torn down while a peer still talks to them: the rank then aborts (SIGABRT) after
    finishing its work, and torchrun reports the whole run as failed."""
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def device() -> torch.device:
    """This rank's device: its GPU (LOCAL_RANK) when CUDA is available, else the CPU."""
    if torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device("cpu")


def model_device(model) -> torch.device:
    return next(model.parameters()).device


def rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def world() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def is_main() -> bool:
    return rank() == 0


def barrier() -> None:
    if world() > 1:
        dist.barrier()


def all_sum(values: list[float]) -> list[float]:
    if world() == 1:
        return list(values)
    tensor = torch.tensor(values, dtype=torch.float64, device=device())
    dist.all_reduce(tensor)
    return tensor.tolist()


def all_max(value: float) -> float:
    if world() == 1:
        return value
    tensor = torch.tensor([value], dtype=torch.float64, device=device())
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return float(tensor)


def union(names: list[str]) -> list[str]:
    """The sorted union of every rank's `names` (e.g. the metrics one of them lacks)."""
    if world() == 1:
        return sorted(set(names))
    gathered: list[list[str]] = [[] for _ in range(world())]
    dist.all_gather_object(gathered, sorted(names))  # our own ranks' metric names
    return sorted({name for part in gathered for name in part})


def gather(items: list) -> list:
    """Every rank's `items` concatenated in rank order on rank 0; an empty list on the others."""
    if world() == 1:
        return list(items)
    parts = [None] * world() if is_main() else None
    dist.gather_object(items, parts, dst=0)  # our own ranks' records, never outside input
    return [x for part in parts for x in part] if is_main() else []


def mean_metrics(metrics: dict[str, float]) -> dict[str, float]:
    """Each key averaged over the ranks that logged it (ranks may log different keys: e.g. an
    estimator's statistics need at least two samples)."""
    if world() == 1:
        return metrics
    gathered: list[dict] = [{} for _ in range(world())]
    dist.all_gather_object(gathered, metrics)  # our own ranks' floats, never outside input
    keys = sorted({k for m in gathered for k in m})
    return {k: sum(m[k] for m in gathered if k in m) / sum(k in m for m in gathered) for k in keys}
