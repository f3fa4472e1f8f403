"""Training with the DeiT recipe on ImageNet-layout folders, on one process or many (torchrun DDP).

Built from timm's pieces: create_transform (RandAugment, random erasing), Mixup/CutMix with
SoftTargetCrossEntropy, create_optimizer_v2 (no weight decay on norms, biases, position embeddings
and InfSA discounts), a per-iteration cosine schedule with warm-up, ModelEmaV3. Each epoch writes
OUT/metrics.jsonl and OUT/last.pth atomically; ``--resume auto`` continues exactly: every epoch
reseeds from (seed, epoch, rank), so a resumed run replays the same data order and augmentations. A resume
with other --epochs / --lr / warm-up / min lr follows the new plan's schedule; other changed flags are
refused (linvit.engine.resume_run).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn as nn
from timm.data import Mixup, create_transform, resolve_data_config
from timm.loss import LabelSmoothingCrossEntropy, SoftTargetCrossEntropy
from timm.utils import ModelEmaV3
from torch.utils.data import Dataset

from .conversion import convert_if_asked
from .data import collate_images
from .data.augment import fix_posterize
from .distributed import all_reduce_sum, cleanup, init_distributed
from .engine import (
    resume_run,
    run_epochs,
    train_loader,
    train_pass,
    training_recipe,
    training_state,
    wrap_ddp,
    write_run_config,
)
from .errors import UsageError
from .evaluate import autocast, class_count, eval_loader, evaluate, image_split
from .models import create_variant
from .utils import compile_model, output_dir
from .utils.runtime import seed_everything


def build_datasets(args, model: nn.Module) -> tuple[Dataset, Dataset, dict]:
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
    fix_posterize(train_tf)  # timm's Posterize at 0 bits raises on Pillow 13 (linvit.data.augment)
    train = image_split(args.data, args.train_split, train_tf, unreadable="replace")
    val = image_split(args.data, args.val_split, create_transform(**config, is_training=False))
    if train.classes != val.classes:
        raise UsageError(f"train and val classes differ: {len(train.classes)} vs {len(val.classes)} class folders")
    return train, val, config


def run_train(args) -> list[dict]:
    """`linvit train`: the whole run; returns the per-epoch metrics (rank 0 writes them to OUT)."""
    rank, world, device = init_distributed(args.device)
    try:
        return _run(args, rank, world, device)
    finally:
        cleanup()


def _mixup_and_criterion(args, num_classes: int) -> tuple[Mixup | None, nn.Module]:
    """DeiT's targets: Mixup/CutMix with soft-target cross-entropy, else (smoothed) cross-entropy."""
    if args.mixup > 0 or args.cutmix > 0:
        if args.batch_size % 2:
            raise UsageError(
                f"Mixup/CutMix pair the images of a batch: --batch-size must be even, got {args.batch_size}"
            )
        mixup = Mixup(
            mixup_alpha=args.mixup, cutmix_alpha=args.cutmix, label_smoothing=args.smoothing, num_classes=num_classes
        )
        return mixup, SoftTargetCrossEntropy()
    if args.smoothing > 0:
        return None, LabelSmoothingCrossEntropy(smoothing=args.smoothing)
    return None, nn.CrossEntropyLoss()


def _run(args, rank: int, world: int, device: torch.device) -> list[dict]:
    output = Path(args.output)
    if rank == 0:
        output_dir(output)
    if args.deterministic:
        torch.use_deterministic_algorithms(True, warn_only=True)
    seed_everything(args.seed)
    num_classes = class_count(args, args.train_split)
    model = create_variant(
        args.model,
        img_size=args.img_size,
        num_classes=num_classes,
        drop_path_rate=args.drop_path,
        pretrained_file=getattr(args, "pretrained_file", None),
        **args.model_kwargs,
    )
    conversion = convert_if_asked(model, getattr(args, "convert", None))
    train_set, val_set, data_config = build_datasets(args, model)
    model.to(device)
    global_batch = args.batch_size * world
    lr = args.lr if args.lr is not None else args.base_lr * global_batch / 512
    sampler, loader = train_loader(train_set, args, rank, world, collate_images, pin_memory=device.type == "cuda")
    val_loader = eval_loader(val_set, args.batch_size, args.workers, rank, world)
    optimizer, scheduler, scaler = training_recipe(model, args, len(loader), device, lr)
    mixup, criterion = _mixup_and_criterion(args, num_classes)
    ema = ModelEmaV3(model, decay=args.model_ema_decay) if args.model_ema else None

    start_epoch, history = resume_run(output, args, model, optimizer, scheduler, ema, scaler, rank)
    run_info = {
        "task": "classification",
        "command": "train",
        "model": args.model,
        "convert": getattr(args, "convert", None),
        "pretrained_file": getattr(args, "pretrained_file", None),
        "conversion": conversion,
        "weights": "ema" if ema is not None else "model",
        "lr": lr,
        "global_batch": global_batch,
        "world_size": world,
        "num_classes": num_classes,
        "data_config": data_config,
        "device": str(device),
    }
    if rank == 0:
        write_run_config(output, args)
        name = f"{args.model} -> {args.convert}" if conversion else args.model
        print(
            f"{name}: {sum(p.numel() for p in model.parameters()):,} params, {num_classes} classes, "
            f"{len(train_set)} train / {len(val_set)} val images, lr {lr:.3g}, world {world}"
        )
    train_net = compile_model(wrap_ddp(model, world, device), args.compile)
    eval_net = compile_model(model, args.compile)
    replaced = torch.zeros((), dtype=torch.int64)  # undecodable training images replaced this epoch (this rank)

    def batch_loss(batch) -> tuple[torch.Tensor, int]:
        images, targets, passed_over = batch
        replaced.add_(passed_over)
        images, targets = images.to(device, non_blocking=True), targets.to(device, non_blocking=True)
        if mixup is not None:
            images, targets = mixup(images, targets)
        with autocast(device, args.amp):
            return criterion(train_net(images).float(), targets), len(images)

    def after_step(step: int) -> None:
        if ema is not None:
            ema.update(model, step=step)

    def train_epoch(epoch: int) -> dict:
        replaced.zero_()
        if hasattr(train_set, "set_epoch"):  # drawn digit canvases: fresh ones each epoch, the same on resume
            train_set.set_epoch(epoch)
        record = train_pass(
            train_net, loader, batch_loss, optimizer, scheduler, scaler, epoch, args, device, rank, after_step
        )
        record["replaced_images"] = int(all_reduce_sum([int(replaced)], device)[0])
        if rank == 0 and record["replaced_images"]:
            print(f"epoch {epoch}: replaced {record['replaced_images']} undecodable training images")
        return record

    def evaluate_epoch(epoch: int) -> dict:
        val = evaluate(eval_net, val_loader, device, args.amp)
        record = {
            "val_top1": val["top1"],
            "val_top5": val["top5"],
            "val_loss": val["loss"],
            "skipped_images": val["skipped"],
        }
        if ema is not None:
            ema_val = evaluate(ema.module, val_loader, device, args.amp)
            record.update(val_top1_ema=ema_val["top1"], val_top5_ema=ema_val["top5"])
        return record

    def state(epoch: int, rngs: list, hist: list) -> dict:
        return training_state(model, optimizer, scheduler, ema, scaler, epoch, rngs, hist, args)

    history = run_epochs(
        args,
        output,
        rank,
        world,
        start_epoch,
        history,
        sampler,
        train_epoch,
        evaluate_epoch,
        state,
        final_model=lambda: ema.module if ema is not None else model,
        run_info=run_info,
        label_names=list(train_set.classes),
    )
    if world > 1 and history:
        # each rank records what it measured, so a run can show that all ranks agree
        (output / f"final_val_rank{rank}.json").write_text(json.dumps(history[-1]))
    return history
