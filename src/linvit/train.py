"""Training with the DeiT recipe on ImageNet-layout folders, on one process or many (torchrun DDP).

Built from timm's pieces: create_transform (RandAugment, random erasing), Mixup/CutMix with
SoftTargetCrossEntropy, create_optimizer_v2 (no weight decay on norms, biases, position embeddings
and InfSA discounts), a per-iteration cosine schedule with warm-up, ModelEmaV3. Each epoch writes
OUT/metrics.jsonl and OUT/last.pth atomically; ``--resume auto`` continues exactly: every epoch
reseeds from (seed, epoch, rank), so a resumed run replays the same data order and augmentations.
"""

from __future__ import annotations

import json
import os
import random
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
from safetensors.torch import save_file
from timm.data import Mixup, create_transform, resolve_data_config
from timm.loss import LabelSmoothingCrossEntropy, SoftTargetCrossEntropy
from timm.optim import create_optimizer_v2
from timm.scheduler import create_scheduler_v2
from timm.utils import ModelEmaV3
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler
from tqdm import tqdm

from .data import SafeImageFolder, collate_skip_none
from .distributed import all_reduce_sum, barrier, cleanup, init_distributed
from .evaluate import autocast, check_num_classes, eval_loader, evaluate
from .models import create_variant
from .utils import compile_model, output_dir

CHECKPOINT = "last.pth"
METRICS = "metrics.jsonl"


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def rng_states() -> dict:
    """RNG states in types torch.load(weights_only=True) accepts (numpy's array as a tensor)."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    return {
        "torch": torch.get_rng_state(),
        "numpy": [kind, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, gauss],
        "python": random.getstate(),
    }


def set_rng_states(states: dict) -> None:
    torch.set_rng_state(states["torch"])
    kind, keys, pos, has_gauss, gauss = states["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
    random.setstate(tuple(tuple(x) if isinstance(x, list) else x for x in states["python"]))


def atomic_save(obj, path: Path) -> None:
    """torch.save to a temp file in the same folder, then rename: a kill never leaves a torn file."""
    tmp = path.with_name(path.name + ".tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def atomic_write_text(text: str, path: Path) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def find_resume(output: Path, resume: str | None) -> Path | None:
    if not resume:
        return None
    if resume == "auto":
        path = output / CHECKPOINT
        return path if path.is_file() else None
    path = Path(resume)
    if not path.is_file():
        raise ValueError(f"--resume {resume}: checkpoint not found")
    return path


def resume_run(output: Path, resume: str | None, model, optimizer, scheduler, ema, scaler, rank: int):
    """Restore everything from a checkpoint (if --resume finds one); returns (start epoch, history).

    metrics.jsonl is rewritten from the checkpoint's history, so the log never holds an epoch the
    checkpoint does not (an epoch interrupted after its log line but before its checkpoint).
    """
    path = find_resume(output, resume)
    if path is None:
        return 0, []
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
        missing = {"model", "optimizer", "scheduler", "epoch", "rng"} - set(ckpt)
    except Exception as err:  # noqa: BLE001 - truncated, corrupt or foreign files all end here
        raise ValueError(
            f"cannot resume from {path}: the file is damaged or not a linvit checkpoint ({type(err).__name__}); "
            f"delete it to start the run over, or pass --resume with another checkpoint"
        ) from err
    if missing:
        raise ValueError(f"cannot resume from {path}: not a linvit training checkpoint (no {sorted(missing)})")
    check_num_classes(model, ckpt["model"], path)
    model.load_state_dict(ckpt["model"])
    optimizer.load_state_dict(ckpt["optimizer"])
    scheduler.load_state_dict(ckpt["scheduler"])
    if ema is not None and ckpt.get("ema") is not None:
        ema.load_state_dict(ckpt["ema"])
    if scaler is not None and ckpt.get("scaler") is not None:
        scaler.load_state_dict(ckpt["scaler"])
    set_rng_states(ckpt["rng"][min(rank, len(ckpt["rng"]) - 1)] if isinstance(ckpt["rng"], list) else ckpt["rng"])
    history = list(ckpt.get("history", []))
    if rank == 0:
        atomic_write_text("".join(json.dumps(h) + "\n" for h in history), output / METRICS)
        print(f"resumed from {path} at epoch {ckpt['epoch'] + 1}")
    return ckpt["epoch"] + 1, history


def training_state(model, optimizer, scheduler, ema, scaler, epoch: int, rngs: list, history: list, args) -> dict:
    return {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "ema": ema.state_dict() if ema is not None else None,
        "scaler": scaler.state_dict() if scaler is not None else None,
        "epoch": epoch,
        "rng": rngs,
        "history": history,
        "args": {k: str(v) for k, v in vars(args).items()},
    }


def save_epoch(output: Path, state: dict, record: dict) -> None:
    """Checkpoint first, then the log line it vouches for."""
    atomic_save(state, output / CHECKPOINT)
    with open(output / METRICS, "a") as f:
        f.write(json.dumps(record) + "\n")


def build_datasets(args, model: nn.Module) -> tuple[SafeImageFolder, SafeImageFolder, dict]:
    config = resolve_data_config(
        {"img_size": args.img_size, "crop_pct": args.crop_pct, "interpolation": args.interpolation}, model=model
    )
    train_tf = create_transform(
        **config,
        is_training=True,
        scale=tuple(args.scale),
        ratio=tuple(args.ratio),
        hflip=args.hflip,
        auto_augment=None if args.aa in (None, "none", "") else args.aa,
        color_jitter=args.color_jitter,
        re_prob=args.reprob,
        re_mode="pixel",
        re_count=1,
    )
    train = SafeImageFolder(Path(args.data) / args.train_split, transform=train_tf)
    val = SafeImageFolder(Path(args.data) / args.val_split, transform=create_transform(**config, is_training=False))
    if train.classes != val.classes:
        raise ValueError(f"train and val classes differ: {len(train.classes)} vs {len(val.classes)} class folders")
    return train, val, config


def optimizer_step(loss: torch.Tensor, model: nn.Module, optimizer, scaler, clip_grad: float | None) -> None:
    """Backward (scaled for fp16), optional gradient clipping, one optimizer step."""
    optimizer.zero_grad(set_to_none=True)
    if scaler is not None:
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
    else:
        loss.backward()
    if clip_grad:
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip_grad)
    if scaler is not None:
        scaler.step(optimizer)
        scaler.update()
    else:
        optimizer.step()


def train_one_epoch(model, loader, optimizer, scheduler, criterion, mixup, ema, scaler, epoch, args, device, rank):
    """One pass over the training shard; returns (mean loss across ranks, images, skipped, seconds)."""
    model.train()
    updates = len(loader)
    loss_sum = seen = skipped = 0.0
    start = time.perf_counter()
    bar = tqdm(loader, desc=f"epoch {epoch}", unit="batch", disable=rank != 0 or not args.progress)
    for step, batch in enumerate(bar):
        if batch is None:
            continue
        images, targets, bad = batch
        skipped += bad
        if mixup is not None and len(targets) % 2:  # Mixup pairs samples; drop one after a skipped image
            images, targets = images[:-1], targets[:-1]
        if len(targets) == 0:
            continue
        images, targets = images.to(device, non_blocking=True), targets.to(device, non_blocking=True)
        if mixup is not None:
            images, targets = mixup(images, targets)
        with autocast(device, args.amp):
            loss = criterion(model(images).float(), targets)
        if not torch.isfinite(loss):
            raise FloatingPointError(f"loss is {loss.item()} at epoch {epoch} step {step}; stopping")
        optimizer_step(loss, model, optimizer, scaler, args.clip_grad)
        scheduler.step_update(num_updates=epoch * updates + step + 1)
        if ema is not None:
            ema.update(
                model.module if isinstance(model, DistributedDataParallel) else model, step=epoch * updates + step
            )
        loss_sum += loss.item() * len(targets)
        seen += len(targets)
        elapsed = time.perf_counter() - start
        bar.set_postfix(
            loss=f"{loss.item():.4f}", lr=f"{optimizer.param_groups[0]['lr']:.2e}", ips=f"{seen / elapsed:.1f}"
        )
    seconds = time.perf_counter() - start
    loss_sum, seen, skipped = all_reduce_sum([loss_sum, seen, skipped], device)
    return loss_sum / max(seen, 1), int(seen), int(skipped), seconds


def run_train(args) -> list[dict]:
    """`linvit train`: the whole run; returns the per-epoch metrics (rank 0 writes them to OUT)."""
    rank, world, device = init_distributed(args.device)
    try:
        return _run(args, rank, world, device)
    finally:
        cleanup()


def _run(args, rank: int, world: int, device: torch.device) -> list[dict]:
    output = Path(args.output)
    if rank == 0:
        output_dir(output)
    if args.deterministic:
        torch.use_deterministic_algorithms(True, warn_only=True)
    seed_everything(args.seed)
    probe = SafeImageFolder(Path(args.data) / args.train_split)
    num_classes = len(probe.classes)
    model = create_variant(
        args.model, img_size=args.img_size, num_classes=num_classes, drop_path_rate=args.drop_path, **args.model_kwargs
    )
    train_set, val_set, data_config = build_datasets(args, model)
    model.to(device)
    global_batch = args.batch_size * world
    lr = args.lr if args.lr is not None else args.base_lr * global_batch / 512
    optimizer = create_optimizer_v2(model, opt=args.opt, lr=lr, weight_decay=args.weight_decay)
    sampler = DistributedSampler(train_set, num_replicas=world, rank=rank, shuffle=True, seed=args.seed, drop_last=True)
    loader = DataLoader(
        train_set,
        batch_size=args.batch_size,
        sampler=sampler,
        num_workers=args.workers,
        drop_last=True,
        collate_fn=collate_skip_none,
        pin_memory=device.type == "cuda",
        persistent_workers=False,
    )
    if len(loader) == 0:
        raise ValueError(f"{len(train_set)} training images are fewer than one batch of {args.batch_size} x {world}")
    val_loader = eval_loader(val_set, args.batch_size, args.workers, rank, world)
    scheduler, _ = create_scheduler_v2(
        optimizer,
        sched="cosine",
        num_epochs=args.epochs,
        warmup_epochs=args.warmup_epochs,
        warmup_lr=args.warmup_lr,
        min_lr=args.min_lr,
        step_on_epochs=False,
        updates_per_epoch=len(loader),
    )
    mixup = None
    if args.mixup > 0 or args.cutmix > 0:
        mixup = Mixup(
            mixup_alpha=args.mixup, cutmix_alpha=args.cutmix, label_smoothing=args.smoothing, num_classes=num_classes
        )
        criterion = SoftTargetCrossEntropy()
    elif args.smoothing > 0:
        criterion = LabelSmoothingCrossEntropy(smoothing=args.smoothing)
    else:
        criterion = nn.CrossEntropyLoss()
    ema = ModelEmaV3(model, decay=args.model_ema_decay) if args.model_ema else None
    scaler = torch.amp.GradScaler(device.type) if args.amp == "fp16" else None

    start_epoch, history = resume_run(output, args.resume, model, optimizer, scheduler, ema, scaler, rank)
    ddp_model = (
        DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
        if world > 1
        else model
    )

    if rank == 0:
        config = {
            **vars(args),
            "lr": lr,
            "global_batch": global_batch,
            "world_size": world,
            "num_classes": num_classes,
            "data_config": data_config,
            "device": str(device),
        }
        atomic_write_text(json.dumps(config, indent=2, default=str), output / "config.json")
        print(
            f"{args.model}: {sum(p.numel() for p in model.parameters()):,} params, {num_classes} classes, "
            f"{len(train_set)} train / {len(val_set)} val images, lr {lr:.3g}, world {world}"
        )
    train_net, eval_net = compile_model(ddp_model, args.compile), compile_model(model, args.compile)
    for epoch in range(start_epoch, args.epochs):
        seed_everything(args.seed + 1000 * epoch + rank)  # replayable on resume
        sampler.set_epoch(epoch)
        train_loss, seen, skipped, seconds = train_one_epoch(
            train_net, loader, optimizer, scheduler, criterion, mixup, ema, scaler, epoch, args, device, rank
        )
        scheduler.step(epoch + 1)
        val = evaluate(eval_net, val_loader, device, args.amp)
        record = {
            "epoch": epoch,
            "train_loss": train_loss,
            "val_top1": val["top1"],
            "val_top5": val["top5"],
            "val_loss": val["loss"],
            "lr": optimizer.param_groups[0]["lr"],
            "epoch_seconds": seconds,
            "images_per_second": seen / seconds if seconds > 0 else None,
            "skipped_images": skipped + val["skipped"],
        }
        if ema is not None:
            ema_val = evaluate(ema.module, val_loader, device, args.amp)
            record.update(val_top1_ema=ema_val["top1"], val_top5_ema=ema_val["top5"])
        history.append(record)
        rngs = gather_rng(world)
        if rank == 0:
            save_epoch(
                output, training_state(model, optimizer, scheduler, ema, scaler, epoch, rngs, history, args), record
            )
            if skipped:
                print(f"epoch {epoch}: skipped {skipped} unreadable images")
            print(" ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in record.items()))
        barrier()
    if rank == 0 and history:
        final = ema.module if ema is not None else model
        save_file({k: v.contiguous() for k, v in final.state_dict().items()}, str(output / "model.safetensors"))
    if world > 1 and history:
        # each rank records what it measured, so a run can show that all ranks agree
        (output / f"final_val_rank{rank}.json").write_text(json.dumps(history[-1]))
    return history


def gather_rng(world: int) -> list[dict]:
    """Every rank's RNG states (rank order) for the checkpoint; a single process has one entry."""
    states = rng_states()
    if world == 1:
        return [states]
    import torch.distributed as dist

    gathered: list = [None] * world
    dist.all_gather_object(gathered, states)
    return gathered
