"""`linvit segment train | eval`: per-pixel cross-entropy training and mIoU evaluation, one process or torchrun.

Training is a Task on linvit's one trainer (linvit.engine.fit): AdamW through timm, a per-iteration cosine
schedule with warm-up, AMP, gradient clipping, DDP, per-epoch reseeding, atomic last.pth with exact resume,
metrics.jsonl and model.safetensors at the end.
"""

from __future__ import annotations

import dataclasses
from functools import partial

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..config import Config, TrainConfig, default_workers
from ..conversion import convert_if_asked
from ..distributed import all_reduce_tensor, distributed_session
from ..engine import Metric, Parts, Run, Task, eval_loader, fit, run_evaluation
from ..errors import UsageError
from ..utils.paths import write_json
from ..utils.runtime import autocast
from ..weights import check_run_labels, load_backbone, load_weights, use_run_folder
from .data import EvalTransform, SegmentationDataset, collate_pairs, find_split, train_transform, upsample_logits
from .metrics import confusion_matrix, scores
from .model import Segmenter, create_segmenter


@dataclasses.dataclass
class SegmenterSpec(Config):
    """What builds a segmenter: the backbone, its pyramid and head widths, its starting weights, a conversion."""

    model: str | None = None
    model_kwargs: dict = dataclasses.field(default_factory=dict)
    pretrained: bool = False
    pyramid_channels: int = 256
    head_channels: int = 128
    backbone_checkpoint: str | None = None
    convert: str | None = None
    img_size: list[int] | None = None  # evaluation: the shorter side images are resized to (None: as they are)


@dataclasses.dataclass
class SegmentConfig(TrainConfig, SegmenterSpec):
    """`linvit segment train`."""

    train_split: str = "train"
    val_split: str = "val"
    epochs: int = 50
    batch_size: int = 8
    lr: float | None = 1e-4
    hflip: float = 0.5
    crop_size: list[int] = dataclasses.field(default_factory=lambda: [512])
    scale: list[float] = dataclasses.field(default_factory=lambda: [0.5, 2.0])


@dataclasses.dataclass
class SegmentEvalConfig(SegmenterSpec):
    """`linvit segment eval`."""

    data: str | None = None
    split: str | None = None  # a run folder's val split, else "val"
    checkpoint: str | None = None
    batch_size: int = 8
    workers: int = dataclasses.field(default_factory=default_workers)
    amp: str = "none"
    device: str = "auto"
    flops_at: int | None = None
    progress: bool = True
    json: str | None = None


def build_model(spec: SegmenterSpec, num_classes: int) -> Segmenter:
    model = create_segmenter(spec.model, num_classes, spec.pyramid_channels, spec.head_channels, **spec.model_kwargs)
    if spec.backbone_checkpoint:
        load_backbone(model.backbone, spec.backbone_checkpoint)
    convert_if_asked(model.backbone, spec.convert)  # after loading the softmax weights
    return model


def pixel_cross_entropy(logits: torch.Tensor, labels: torch.Tensor, ignore_index: int) -> torch.Tensor:
    """Mean cross-entropy over the labelled pixels, in float32; 0 (still attached to the graph, so DDP's
    gradient all-reduce runs as on every rank) for a batch whose pixels are all ignore_index, where
    F.cross_entropy's mean is 0 / 0 = NaN and killed the run."""
    losses = F.cross_entropy(logits.float(), labels, ignore_index=ignore_index, reduction="none")
    return losses.sum() / (labels != ignore_index).sum().clamp_min(1).to(losses.dtype)


class SegmentationScores(Metric):
    """One confusion matrix, each prediction scored at its label map's own resolution, summed over ranks."""

    def __init__(self, num_classes: int, device) -> None:
        self.num_classes, self.device = num_classes, device
        self.matrix = torch.zeros(num_classes, num_classes, dtype=torch.int64, device=device)

    def update(self, forward, batch) -> None:
        images, labels = batch
        for image, label in zip(images, labels, strict=True):  # sizes may differ: one image at a time
            logits = forward(image[None].to(self.device))
            pred = upsample_logits(logits.float(), label.shape[-2:]).argmax(1)[0]
            self.matrix += confusion_matrix(pred, label.to(self.device), self.num_classes)

    def result(self) -> dict:
        all_reduce_tensor(self.matrix)
        return {**scores(self.matrix.cpu()), "confusion": self.matrix.cpu().tolist()}


def evaluate_segmentation(
    model: nn.Module, loader, num_classes: int, device, amp: str = "none", progress: bool = False
) -> dict:
    """mIoU, pixel and mean accuracy, per-class IoU and the confusion matrix, the same on every rank."""
    return run_evaluation(model, loader, SegmentationScores(num_classes, device), device, amp, progress)


class Segmentation(Task):
    """Semantic segmentation: random crops with scale jitter, per-pixel cross-entropy, mIoU validation."""

    name = "segmentation"
    command = "segment train"

    def build(self, config: SegmentConfig, device, rank: int, world: int) -> Parts:
        self.split = find_split(config.data, config.train_split)
        val_split = find_split(config.data, config.val_split)
        if self.split.num_classes != val_split.num_classes:
            raise UsageError(f"train and val label sets differ: {self.split.num_classes} vs {val_split.num_classes}")
        if self.split.num_classes < 2:  # every pixel one class: loss 0 and 100% mIoU from the first step
            raise UsageError(f"{config.data}: one class ({self.split.class_names[0]}); segmentation needs two or more")
        crop = tuple(config.crop_size) if len(config.crop_size) == 2 else (config.crop_size[0],) * 2
        train_set = SegmentationDataset(self.split, train_transform(crop, tuple(config.scale), config.hflip))
        val_set = SegmentationDataset(val_split, EvalTransform(config.img_size))
        val_loader = eval_loader(val_set, config.batch_size, config.workers, rank, world, collate_fn=collate_pairs)
        model = build_model(config, self.split.num_classes)
        return Parts(model, train_set, val_loader, label_names=self.split.class_names)

    def batch_loss(self, run: Run, batch) -> tuple[torch.Tensor, int]:
        images, labels = (t.to(run.device, non_blocking=True) for t in batch)
        with autocast(run.device, run.config.amp):
            logits = run.train_net(images)
        return pixel_cross_entropy(logits, labels, self.split.ignore_index), len(images)

    def evaluate(self, run: Run, epoch: int) -> dict:
        val = evaluate_segmentation(run.model, run.parts.val_loader, self.split.num_classes, run.device, run.config.amp)
        return {"val_miou": val["miou"], "val_pixel_acc": val["pixel_acc"], "val_mean_acc": val["mean_acc"]}

    def run_info(self, run: Run) -> dict:
        config = run.config
        return {
            "model": config.model,
            "model_kwargs": config.model_kwargs,
            "pyramid_channels": config.pyramid_channels,
            "head_channels": config.head_channels,
            "convert": config.convert,
            "weights": "model",
            "num_classes": self.split.num_classes,
            "layout": self.split.layout,
            "world_size": run.world,
            "device": str(run.device),
        }

    def summary(self, run: Run) -> str:
        params = sum(p.numel() for p in run.model.parameters())
        return (
            f"{run.config.model} + pyramid + semantic-FPN head: {params:,} params, {self.split.num_classes} classes "
            f"({self.split.layout}), {len(run.parts.train_set)} train images, world {run.world}"
        )


def run_segment_train(config: SegmentConfig) -> list[dict]:
    """`linvit segment train`: the whole run; returns the per-epoch metrics (rank 0 writes them to the output)."""
    return fit(Segmentation(), config)


def backbone_macs(model: Segmenter, size: int) -> dict:
    """GMACs of the backbone and of the whole segmenter on one size x size image (FLOPs / 2)."""
    from ..utils.flops import count_flops

    x = torch.zeros(1, 3, size, size)
    with torch.no_grad():
        return {
            f"{name}_gmacs@{size}": count_flops(partial(fn, x)) / 2e9
            for name, fn in (("backbone", model.pyramid.last_map), ("segmenter", model))
        }


def run_segment_eval(config: SegmentEvalConfig) -> dict:
    """`linvit segment eval`: mIoU, pixel accuracy and per-class IoU of a checkpoint on one split."""
    with distributed_session(config.device) as (rank, world, device):
        config, folder = use_run_folder(config)  # --checkpoint RUN: the segmenter is rebuilt from the run's args.yaml
        config = config.replace(split=config.split or "val")
        split = find_split(config.data, config.split)
        names = {"label_names": split.class_names} if split.layout == "masks" else {}  # meta.json's names (ADE's
        check_run_labels(folder, config.data, num_classes=split.num_classes, **names)  # may be placeholders)
        model = build_model(config, split.num_classes)
        if config.checkpoint:
            load_weights(model, config.checkpoint)
        model.to(device)
        dataset = SegmentationDataset(split, EvalTransform(config.img_size))
        loader = eval_loader(dataset, config.batch_size, config.workers, rank, world, collate_fn=collate_pairs)
        progress = rank == 0 and config.progress
        metrics = evaluate_segmentation(model, loader, split.num_classes, device, config.amp, progress=progress)
        metrics.update(model=config.model, checkpoint=config.checkpoint, split=config.split, data=str(config.data))
        metrics.update(images=len(dataset), class_names=split.class_names)
        if config.flops_at:
            metrics.update(backbone_macs(model.cpu(), config.flops_at))
        if rank == 0:
            print_scores(metrics, split.class_names, len(dataset))
            if config.flops_at:
                px = config.flops_at
                print(f"GMACs at {px} x {px}: backbone {metrics[f'backbone_gmacs@{px}']:.3g}, "
                      f"segmenter {metrics[f'segmenter_gmacs@{px}']:.3g}")  # fmt: skip
            if config.json:
                write_json(config.json, metrics)
        return metrics


def print_scores(metrics: dict, class_names: list[str], images: int) -> None:
    print(
        f"mIoU {metrics['miou']:.2f}  pixel acc {metrics['pixel_acc']:.2f}  "
        f"mean acc {metrics['mean_acc']:.2f}  ({images} images)"
    )
    for name, iou in zip(class_names, metrics["per_class_iou"], strict=True):
        print(f"  {name:<24} IoU {iou:6.2f}")
