"""torchrun helpers: process-group set-up (gloo on CPU, NCCL on CUDA), rank queries, reductions."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.distributed as dist

from .errors import UsageError


def resolve_device(device: str = "auto") -> torch.device:
    """--device auto|cpu|cuda as a torch.device (this process's LOCAL_RANK GPU under torchrun)."""
    if device == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda requested but torch sees no CUDA device")
    use_cuda = torch.cuda.is_available() if device == "auto" else device == "cuda"
    return torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}" if use_cuda else "cpu")


def init_distributed(device: str = "auto") -> tuple[int, int, torch.device]:
    """Join the torchrun process group if launched by torchrun; returns (rank, world_size, device)."""
    dev = resolve_device(device)
    use_cuda = dev.type == "cuda"
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    if use_cuda:
        torch.cuda.set_device(dev)
    if world > 1 and not dist.is_initialized():
        dist.init_process_group(backend="nccl" if use_cuda else "gloo")
    return rank, world, dev


@contextmanager
def distributed_session(device: str = "auto") -> Iterator[tuple[int, int, torch.device]]:
    """(rank, world_size, device) for a command's whole run: joins torchrun's process group (if launched by
    torchrun) and leaves it however the command ends; inside another session (a command of several runs, such
    as distill's stages) it joins nothing new and leaves nothing."""
    outer = is_distributed()
    try:
        yield init_distributed(device)
    finally:
        if not outer:
            cleanup()


def is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def all_reduce_sum(values: list[float], device: torch.device) -> list[float]:
    """Sum each value over ranks (identity in a single process); float64 so counts stay exact."""
    if not is_distributed():
        return list(values)
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return t.tolist()


def all_reduce_tensor(t: torch.Tensor) -> torch.Tensor:
    """Sum a tensor over ranks in place (identity in a single process); returns it."""
    if is_distributed():
        dist.all_reduce(t)
    return t


def barrier() -> None:
    if is_distributed():
        dist.barrier()


def cleanup() -> None:
    if is_distributed():
        dist.destroy_process_group()
