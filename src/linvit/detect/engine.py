"""`linvit detect train|eval`: torchvision detectors on linvit backbones, on the shared training skeleton.

The recipe is the segmentation one (AdamW through timm, cosine per iteration with warm-up, AMP, torchrun DDP,
`--resume auto`, metrics.jsonl, a model folder at the end). Evaluation runs on every rank's shard of the
validation images; the detections are gathered on rank 0, scored by pycocotools' COCOeval and the numbers
shared with every rank, so a torchrun evaluation equals a single-process one.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
from tqdm import tqdm

from ..distributed import cleanup, init_distributed, is_distributed
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
from ..evaluate import autocast, eval_loader, load_weights, write_json
from ..utils import output_dir
from ..utils.artifacts import use_run_folder
from ..utils.runtime import seed_everything
from .coco_eval import STAT_NAMES, coco_stats, to_coco_results
from .data import CocoDetection, collate_detection, find_coco_split
from .model import create_detector


def build_detector(args, num_classes: int) -> nn.Module:
    return create_detector(
        args.model,
        num_classes,
        args.detector,
        min_size=args.min_size,
        max_size=args.max_size,
        anchor_base=args.anchor_base,
        pyramid_channels=args.pyramid_channels,
        backbone_checkpoint=getattr(args, "backbone_checkpoint", None),
        convert=getattr(args, "convert", None),
        grad_checkpointing=getattr(args, "grad_checkpointing", False),
        **args.model_kwargs,
    )


def dataset(args, split: str, train: bool) -> CocoDetection:
    """--ann-file/--images when given (eval), else ROOT/annotations/instances_<split>.json + ROOT/<split>/."""
    if getattr(args, "ann_file", None) and not train:
        images, ann = Path(args.images or Path(args.ann_file).parent), Path(args.ann_file)
    else:
        images, ann = find_coco_split(args.data, split)
    return CocoDetection(images, ann, train=train, masks=args.detector == "maskrcnn", hflip=getattr(args, "hflip", 0))


@torch.no_grad()
def detect_all(model: nn.Module, loader, data: CocoDetection, device, amp: str, progress: bool) -> list[dict]:
    """COCO result entries for this rank's images."""
    model.eval()
    results = []
    for images, targets in tqdm(loader, desc="detect", leave=False, disable=not progress):
        with autocast(device, amp):
            outputs = model([im.to(device) for im in images])
        for output, target in zip(outputs, targets, strict=True):
            results += to_coco_results(output, target["image_id"], data.category_ids)
    return results


def evaluate_detection(model, loader, data: CocoDetection, device, amp="none", progress=False):
    """(COCO numbers, summary text, all detections): gathered on rank 0, scored there, shared with every rank."""
    results = detect_all(model, loader, data, device, amp, progress)
    if is_distributed():
        parts = [None] * dist.get_world_size()
        dist.all_gather_object(parts, results)
        results = [r for part in parts for r in part]
    results.sort(key=lambda r: (r["image_id"], -r["score"], r["category_id"]))  # rank order does not matter
    outcome = [None]
    if not is_distributed() or dist.get_rank() == 0:
        iou_types = ["bbox"] + (["segm"] if data.masks else [])
        stats, text = {}, ""
        for iou in iou_types:
            numbers, summary = coco_stats(data.coco, results, iou, image_ids=data.ids)
            stats.update({(k if iou == "bbox" else f"mask_{k}"): v for k, v in numbers.items()})
            text += f"{iou}:\n{summary}"
        outcome = [(stats, text)]
    if is_distributed():
        dist.broadcast_object_list(outcome, src=0)
    stats, text = outcome[0]
    return stats, text, results


def run_detect_train(args) -> list[dict]:
    """`linvit detect train`: the whole run; returns the per-epoch metrics (rank 0 writes them to OUT)."""
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
    train_set, val_set = dataset(args, args.train_split, True), dataset(args, args.val_split, False)
    if train_set.category_ids != val_set.category_ids:
        raise UsageError(f"train and val categories differ: {train_set.category_ids} vs {val_set.category_ids}")
    sampler, loader = train_loader(train_set, args, rank, world, collate_detection)
    val_loader = eval_loader(val_set, args.batch_size, args.workers, rank, world, collate_fn=collate_detection)
    model = build_detector(args, train_set.num_classes).to(device)
    optimizer, scheduler, scaler = training_recipe(model, args, len(loader), device)
    start_epoch, history = resume_run(output, args, model, optimizer, scheduler, None, scaler, rank)
    net = wrap_ddp(model, world, device)
    run_info = {
        "task": "detection",
        "command": "detect train",
        "model": args.model,
        "detector": args.detector,
        "convert": getattr(args, "convert", None),
        "weights": "model",
        "num_classes": train_set.num_classes,
        "category_ids": train_set.category_ids,
        "world_size": world,
        "device": str(device),
    }
    if rank == 0:
        write_run_config(output, args)
        params = sum(p.numel() for p in model.parameters())
        skipped = ", ".join(f"{n} {k}" for k, n in (train_set.skipped + val_set.skipped).items()) or "none"
        print(
            f"{args.detector} on {args.model}: {params:,} params, {len(train_set.category_ids)} categories, "
            f"{len(train_set)} train / {len(val_set)} val images (annotations skipped: {skipped}), world {world}"
        )

    def batch_loss(batch) -> tuple[torch.Tensor, int]:
        images = [im.to(device, non_blocking=True) for im in batch[0]]
        targets = [{k: v.to(device) if torch.is_tensor(v) else v for k, v in t.items()} for t in batch[1]]
        with autocast(device, args.amp):
            losses = net(images, targets)
        return sum(v.float() for v in losses.values()), len(images)

    def train_epoch(epoch: int) -> dict:
        return train_pass(net, loader, batch_loss, optimizer, scheduler, scaler, epoch, args, device, rank)

    def evaluate_epoch(epoch: int) -> dict:
        stats, _, _ = evaluate_detection(model, val_loader, val_set, device, args.amp)
        return {f"val_{k}": v for k, v in stats.items() if k in ("AP", "AP50", "AP75", "mask_AP")}

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
        label_names=train_set.class_names,
    )


def run_detect_eval(args) -> dict:
    """`linvit detect eval`: detections.json (COCO results format) and the 12 COCO numbers of a checkpoint."""
    rank, world, device = init_distributed(args.device)
    try:
        use_run_folder(args)  # --checkpoint RUN: the detector is rebuilt from the run's args.yaml
        data = dataset(args, args.split, False)
        model = build_detector(args, data.num_classes)
        if args.checkpoint:
            load_weights(model, args.checkpoint)
        model.to(device)
        loader = eval_loader(data, args.batch_size, args.workers, rank, world, collate_fn=collate_detection)
        stats, text, results = evaluate_detection(
            model, loader, data, device, args.amp, progress=rank == 0 and getattr(args, "progress", True)
        )
        metrics = {**stats, "model": args.model, "detector": args.detector, "checkpoint": args.checkpoint}
        metrics.update({k: getattr(args, k) for k in ("min_size", "max_size", "anchor_base", "model_kwargs")})
        metrics.update(images=len(data), detections=len(results), skipped_annotations=dict(data.skipped))
        if rank == 0:
            print(text.rstrip())
            print("  ".join(f"{k} {stats[k]:.2f}" for k in STAT_NAMES))
            out = Path(args.out)
            out.mkdir(parents=True, exist_ok=True)
            (out / "detections.json").write_text(json.dumps(results))
            write_json(out / "metrics.json", metrics)
        return metrics
    finally:
        cleanup()
