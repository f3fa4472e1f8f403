"""`linvit segment train | eval`: per-pixel cross-entropy training and mIoU evaluation, one process or torchrun.

The classification engine's machinery is reused as is: AdamW through timm's create_optimizer_v2 (no
weight decay on norms, biases, position embeddings, InfSA discounts), a per-iteration cosine schedule
with warm-up, AMP, gradient clipping, DDP, per-epoch reseeding, atomic last.pth with exact resume,
metrics.jsonl and model.safetensors at the end.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F
from tqdm import tqdm

from ..conversion import convert_if_asked
from ..distributed import all_reduce_tensor, cleanup, init_distributed
from ..engine import (
    resume_run,
    run_epochs,
    train_loader,
    train_pass,
    training_recipe,
    training_state,
    wrap_ddp,
    write_run_config,
)
from ..errors import UsageError
from ..evaluate import autocast, eval_loader, load_backbone, load_weights, write_json
from ..utils import compile_model, output_dir
from ..utils.artifacts import use_run_folder
from ..utils.runtime import seed_everything
from .data import EvalTransform, SegmentationDataset, collate_pairs, find_split, train_transform, upsample_logits
from .metrics import confusion_matrix, scores
from .model import Segmenter, create_segmenter


def build_model(args, num_classes: int) -> Segmenter:
    model = create_segmenter(args.model, num_classes, args.pyramid_channels, args.head_channels, **args.model_kwargs)
    if getattr(args, "backbone_checkpoint", None):
        load_backbone(model.backbone, args.backbone_checkpoint)
    convert_if_asked(model.backbone, getattr(args, "convert", None))  # after loading the softmax weights
    return model


def pixel_cross_entropy(logits: torch.Tensor, labels: torch.Tensor, ignore_index: int) -> torch.Tensor:
    """Mean cross-entropy over the labelled pixels, in float32; 0 (still attached to the graph, so DDP's
    gradient all-reduce runs as on every rank) for a batch whose pixels are all ignore_index, where
    F.cross_entropy's mean is 0 / 0 = NaN and killed the run."""
    losses = F.cross_entropy(logits.float(), labels, ignore_index=ignore_index, reduction="none")
    return losses.sum() / (labels != ignore_index).sum().clamp_min(1).to(losses.dtype)


@torch.no_grad()
def evaluate_segmentation(
    model: nn.Module, loader, num_classes: int, device, amp: str = "none", progress: bool = False
) -> dict:
    """Scores at each label map's own resolution, summed over ranks (every rank returns the same)."""
    model.eval()
    matrix = torch.zeros(num_classes, num_classes, dtype=torch.int64, device=device)
    for images, labels in tqdm(loader, desc="eval", leave=False, disable=not progress):
        for image, label in zip(images, labels, strict=True):  # sizes may differ: one image at a time
            with autocast(device, amp):
                logits = model(image[None].to(device))
            pred = upsample_logits(logits.float(), label.shape[-2:]).argmax(1)[0]
            matrix += confusion_matrix(pred, label.to(device), num_classes)
    all_reduce_tensor(matrix)
    return {**scores(matrix.cpu()), "confusion": matrix.cpu().tolist()}


def _loaders(args, rank: int, world: int, device):
    train_split = find_split(args.data, args.train_split)
    val_split = find_split(args.data, args.val_split)
    if train_split.num_classes != val_split.num_classes:
        raise UsageError(f"train and val label sets differ: {train_split.num_classes} vs {val_split.num_classes}")
    crop = tuple(args.crop_size) if len(args.crop_size) == 2 else (args.crop_size[0], args.crop_size[0])
    train_set = SegmentationDataset(train_split, train_transform(crop, tuple(args.scale), args.hflip))
    val_set = SegmentationDataset(val_split, EvalTransform(args.img_size))
    sampler, loader = train_loader(train_set, args, rank, world, pin_memory=device.type == "cuda")
    val_loader = eval_loader(val_set, args.batch_size, args.workers, rank, world, collate_fn=collate_pairs)
    return train_split, loader, sampler, val_loader


def run_segment_train(args) -> list[dict]:
    """`linvit segment train`: the whole run; returns the per-epoch metrics (rank 0 writes them to OUT)."""
    rank, world, device = init_distributed(args.device)
    try:
        return _train(args, rank, world, device)
    finally:
        cleanup()


def _train(args, rank: int, world: int, device) -> list[dict]:
    output = Path(args.output)
    if rank == 0:
        output_dir(output)
    seed_everything(args.seed)
    split, loader, sampler, val_loader = _loaders(args, rank, world, device)
    model = build_model(args, split.num_classes).to(device)
    optimizer, scheduler, scaler = training_recipe(model, args, len(loader), device)
    start_epoch, history = resume_run(output, args, model, optimizer, scheduler, None, scaler, rank)
    net = compile_model(wrap_ddp(model, world, device), args.compile)
    run_info = {
        "task": "segmentation",
        "command": "segment train",
        "model": args.model,
        "model_kwargs": args.model_kwargs,
        "pyramid_channels": args.pyramid_channels,
        "head_channels": args.head_channels,
        "convert": getattr(args, "convert", None),
        "weights": "model",
        "num_classes": split.num_classes,
        "layout": split.layout,
        "world_size": world,
        "device": str(device),
    }
    if rank == 0:
        write_run_config(output, args)
        params = sum(p.numel() for p in model.parameters())
        print(
            f"{args.model} + pyramid + semantic-FPN head: {params:,} params, {split.num_classes} classes "
            f"({split.layout}), {len(loader.dataset)} train images, world {world}"
        )

    def batch_loss(batch) -> tuple[torch.Tensor, int]:
        images, labels = (t.to(device, non_blocking=True) for t in batch)
        with autocast(device, args.amp):
            logits = net(images)
        return pixel_cross_entropy(logits, labels, split.ignore_index), len(images)

    def train_epoch(epoch: int) -> dict:
        return train_pass(net, loader, batch_loss, optimizer, scheduler, scaler, epoch, args, device, rank)

    def evaluate_epoch(epoch: int) -> dict:
        val = evaluate_segmentation(model, val_loader, split.num_classes, device, args.amp)
        return {"val_miou": val["miou"], "val_pixel_acc": val["pixel_acc"], "val_mean_acc": val["mean_acc"]}

    def state(epoch: int, rngs: list, hist: list) -> dict:
        return training_state(model, optimizer, scheduler, None, scaler, epoch, rngs, hist, args)

    return run_epochs(
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
        lambda: model,
        run_info=run_info,
        label_names=split.class_names,
    )


def backbone_macs(model: Segmenter, size: int) -> dict:
    """GMACs of the backbone and of the whole segmenter on one size x size image (FLOPs / 2)."""
    from ..utils.flops import count_flops

    x = torch.zeros(1, 3, size, size)
    with torch.no_grad():
        return {
            f"{name}_gmacs@{size}": count_flops(partial(fn, x)) / 2e9
            for name, fn in (("backbone", model.pyramid.last_map), ("segmenter", model))
        }


def run_segment_eval(args) -> dict:
    """`linvit segment eval`: mIoU, pixel accuracy and per-class IoU of a checkpoint on one split."""
    rank, world, device = init_distributed(args.device)
    try:
        split = find_split(args.data, args.split)
        use_run_folder(args)  # --checkpoint RUN: the segmenter is rebuilt from the run's args.yaml
        model = build_model(args, split.num_classes)
        if args.checkpoint:
            load_weights(model, args.checkpoint)
        model.to(device)
        dataset = SegmentationDataset(split, EvalTransform(args.img_size))
        loader = eval_loader(dataset, args.batch_size, args.workers, rank, world, collate_fn=collate_pairs)
        metrics = evaluate_segmentation(
            model, loader, split.num_classes, device, args.amp, progress=rank == 0 and getattr(args, "progress", True)
        )
        metrics.update(
            model=args.model,
            checkpoint=args.checkpoint,
            split=args.split,
            data=str(args.data),
            images=len(dataset),
            class_names=split.class_names,
        )
        if args.flops_at:
            metrics.update(backbone_macs(model.cpu(), args.flops_at))
        if rank == 0:
            print(
                f"mIoU {metrics['miou']:.2f}  pixel acc {metrics['pixel_acc']:.2f}  "
                f"mean acc {metrics['mean_acc']:.2f}  ({len(dataset)} images)"
            )
            for name, iou in zip(split.class_names, metrics["per_class_iou"], strict=True):
                print(f"  {name:<24} IoU {iou:6.2f}")
            if args.json:
                write_json(args.json, metrics)
        return metrics
    finally:
        cleanup()
