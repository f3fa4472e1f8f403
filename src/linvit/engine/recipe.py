"""The optimisation recipe and data feeding every task shares: timm's optimizer and cosine schedule, the
fp16 scaler, this rank's shard of the training set, DDP."""

from __future__ import annotations

import torch
import torch.nn as nn
from timm.optim import create_optimizer_v2
from timm.scheduler import create_scheduler_v2
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler

from ..config import TrainConfig
from ..errors import UsageError


def training_recipe(
    model: nn.Module, config: TrainConfig, updates_per_epoch: int, device: torch.device, lr=None, lr_scales=None
):
    """(optimizer, scheduler, scaler): config.opt (default AdamW) through timm (no decay on norms, biases,
    position embeddings, InfSA discounts), cosine per iteration to config.min_lr after a warm-up from
    config.warmup_lr (as schedule_ends takes them), fp16 gradient scaling. lr defaults to config.lr;
    lr_scales ({parameter: factor}) puts those parameters in groups of their own at factor x every lr."""
    lr = config.lr if lr is None else lr
    optimizer = create_optimizer_v2(model, opt=config.opt, lr=lr, weight_decay=config.weight_decay)
    if lr_scales:
        split_by_lr_scale(optimizer, lr_scales)  # before the scheduler, which reads every group's lr and lr_scale
    warmup_lr, min_lr = schedule_ends(config, lr)
    scheduler, _ = create_scheduler_v2(
        optimizer,
        sched="cosine",
        num_epochs=config.epochs,
        warmup_epochs=config.warmup_epochs,
        warmup_lr=warmup_lr,
        min_lr=min_lr,
        step_on_epochs=False,
        updates_per_epoch=updates_per_epoch,
    )
    scaler = torch.amp.GradScaler(device.type) if config.amp == "fp16" else None
    return optimizer, scheduler, scaler


def schedule_ends(config: TrainConfig, lr: float) -> tuple[float, float]:
    """(warm-up start, cosine end): the config's, or lr / 1000 and lr / 100 where it has none or where its
    value is above lr (train's fixed 1e-6 and 1e-5 under the lr a small batch scales to: the "decay" would rise
    to its end); schedule_notes says so."""
    warmup = lr * 1e-3 if config.warmup_lr is None or config.warmup_lr > lr else config.warmup_lr
    end = lr * 1e-2 if config.min_lr is None or config.min_lr > lr else config.min_lr
    return warmup, end


def schedule_notes(config: TrainConfig, lr: float, epochs_flag: str = "--epochs") -> list[str]:
    """One line for each thing of the schedule a user would not expect: an end or start above the peak (taken
    as a fraction of lr instead) and a warm-up as long as the run (it never reaches its peak)."""
    notes = []
    for flag, value, share in (("--warmup-lr", config.warmup_lr, "1/1000"), ("--min-lr", config.min_lr, "1/100")):
        if value is not None and value > lr:
            notes.append(f"{flag} {value:g} is above the learning rate {lr:.3g}: the schedule uses {share} of it")
    if config.warmup_epochs >= config.epochs:
        notes.append(
            f"--warmup-epochs {config.warmup_epochs} >= {epochs_flag} {config.epochs}: the run ends in warm-up, "
            f"below its learning rate {lr:.3g}"
        )
    return notes


def split_by_lr_scale(optimizer: torch.optim.Optimizer, lr_scales: dict[nn.Parameter, float]) -> None:
    """Each of timm's groups (decay / no decay) split where lr_scales names some of its parameters: the rest
    first (group 0, whose lr the logs print, where any parameter is left unscaled), then one group per factor
    with "lr_scale", by which timm's schedulers multiply every lr they set. The same groups on every rank and
    every resume of one config (resume.restore_lr_scales puts the factors back after loading)."""
    scales = {id(p): s for p, s in lr_scales.items()}
    groups = []
    for group in optimizer.param_groups:
        settings = {k: v for k, v in group.items() if k != "params"}
        plain = [p for p in group["params"] if id(p) not in scales]
        if plain:
            groups.append({**settings, "params": plain})
        for scale in sorted({scales[id(p)] for p in group["params"] if id(p) in scales}):
            scaled = [p for p in group["params"] if scales.get(id(p)) == scale]
            groups.append({**settings, "params": scaled, "lr_scale": scale})  # scaled from the scheduler's start
    optimizer.param_groups.clear()
    for group in groups:
        optimizer.add_param_group(group)


def restore_lr_scales(optimizer: torch.optim.Optimizer, scales: list[float | None]) -> None:
    """Put back each group's lr_scale of this run's config after loading a checkpoint's optimizer (torch keeps the
    saved groups' settings): resumed with a new --transfer-lr, --map-lr's groups keep map_lr / transfer_lr."""
    for group, scale in zip(optimizer.param_groups, scales, strict=True):
        if scale is None:
            group.pop("lr_scale", None)
        else:
            group["lr_scale"] = scale


def train_loader(train_set, config: TrainConfig, rank: int, world: int, collate_fn=None, pin_memory: bool = False):
    """(sampler, loader): this rank's shuffled shard of the training set (seeded by config.seed; the sampler's
    set_epoch reshuffles) in full batches, since DDP needs the same step count on every rank. A set smaller
    than one global batch is a usage error."""
    sampler = DistributedSampler(
        train_set, num_replicas=world, rank=rank, shuffle=True, seed=config.seed, drop_last=True
    )
    loader = DataLoader(
        train_set,
        batch_size=config.batch_size,
        sampler=sampler,
        num_workers=config.workers,
        drop_last=True,
        collate_fn=collate_fn,
        pin_memory=pin_memory,
    )
    if len(loader) == 0:
        raise UsageError(f"{len(train_set)} training images are fewer than one batch of {config.batch_size} x {world}")
    return sampler, loader


def wrap_ddp(model: nn.Module, world: int, device: torch.device) -> nn.Module:
    """DistributedDataParallel around model when torchrun started more than one process."""
    if world == 1:
        return model
    return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
