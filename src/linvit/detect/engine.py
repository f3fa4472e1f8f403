"""`linvit detect train|eval`: torchvision detectors on linvit backbones, as a Task on the one trainer.

The recipe is the segmentation one (AdamW through timm, cosine per iteration with warm-up, AMP, torchrun DDP,
`--resume auto`, metrics.jsonl, a model folder at the end). Evaluation runs on every rank's shard of the
validation images; the detections are gathered on rank 0, scored by pycocotools' COCOeval and the numbers
shared with every rank, so a torchrun evaluation equals a single-process one.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn

from ..config import Config, TrainConfig, default_workers
from ..distributed import distributed_session, is_distributed
from ..engine import Metric, Parts, Run, Task, eval_loader, fit, run_evaluation
from ..errors import UsageError
from ..utils.paths import write_json
from ..utils.runtime import autocast
from ..weights import check_run_labels, load_weights, use_run_folder
from .coco_eval import STAT_NAMES, coco_stats, to_coco_results
from .data import CocoDetection, collate_detection, find_coco_split
from .model import create_detector


@dataclasses.dataclass
class DetectorSpec(Config):
    """What builds a detector: the backbone, the torchvision head, its resize and anchors, the pyramid width."""

    model: str | None = None
    model_kwargs: dict = dataclasses.field(default_factory=dict)
    pretrained: bool = False
    detector: str = "fasterrcnn"
    min_size: int = 800
    max_size: int = 1333
    anchor_base: int = 32
    pyramid_channels: int = 256
    backbone_checkpoint: str | None = None
    convert: str | None = None
    grad_checkpointing: bool = False


@dataclasses.dataclass
class DetectConfig(TrainConfig, DetectorSpec):
    """`linvit detect train`."""

    train_split: str = "train2017"
    val_split: str = "val2017"
    epochs: int = 12
    batch_size: int = 2
    lr: float | None = 1e-4
    hflip: float = 0.5


@dataclasses.dataclass
class DetectEvalConfig(DetectorSpec):
    """`linvit detect eval`: a split of --data, or --ann-file (and --images) directly."""

    data: str | None = None
    split: str | None = None  # a run folder's val split, else COCO's val2017
    ann_file: str | None = None
    images: str | None = None
    checkpoint: str | None = None
    batch_size: int = 2
    workers: int = dataclasses.field(default_factory=default_workers)
    amp: str = "none"
    device: str = "auto"
    progress: bool = True
    output: str | None = None  # the folder detections.json and metrics.json go to


def build_detector(spec: DetectorSpec, num_classes: int) -> nn.Module:
    return create_detector(
        spec.model,
        num_classes,
        spec.detector,
        min_size=spec.min_size,
        max_size=spec.max_size,
        anchor_base=spec.anchor_base,
        pyramid_channels=spec.pyramid_channels,
        backbone_checkpoint=spec.backbone_checkpoint,
        convert=spec.convert,
        grad_checkpointing=spec.grad_checkpointing,
        **spec.model_kwargs,
    )


def coco_split(data, split: str, train: bool, masks: bool, hflip: float = 0.0, ann_file=None, images=None):
    """ann_file (and images, default its folder) when given, else ROOT/annotations/instances_<split>.json and
    ROOT/<split>/."""
    if ann_file and not train:
        folder, ann = Path(images or Path(ann_file).parent), Path(ann_file)
    else:
        folder, ann = find_coco_split(data, split)
    return CocoDetection(folder, ann, train=train, masks=masks, hflip=hflip)


class CocoScores(Metric):
    """COCO result entries of this rank's images; at the end gathered on rank 0, scored there by COCOeval and
    the numbers shared with every rank. The result: (COCO numbers, summary text, all detections)."""

    def __init__(self, data: CocoDetection, device) -> None:
        self.data, self.device, self.results = data, device, []

    def update(self, forward, batch) -> None:
        images, targets = batch
        outputs = forward([im.to(self.device) for im in images])
        for output, target in zip(outputs, targets, strict=True):
            self.results += to_coco_results(output, target["image_id"], self.data.category_ids)

    def result(self) -> tuple[dict, str, list[dict]]:
        results = self.results
        if is_distributed():
            parts = [None] * dist.get_world_size()
            dist.all_gather_object(parts, results)
            results = [r for part in parts for r in part]
        results.sort(key=lambda r: (r["image_id"], -r["score"], r["category_id"]))  # rank order does not matter
        outcome = [None]
        if not is_distributed() or dist.get_rank() == 0:
            outcome = [self._score(results)]
        if is_distributed():
            dist.broadcast_object_list(outcome, src=0)
        stats, text = outcome[0]
        return stats, text, results

    def _score(self, results: list[dict]) -> tuple[dict, str]:
        iou_types = ["bbox"] + (["segm"] if self.data.masks else [])
        stats, text = {}, ""
        for iou in iou_types:
            numbers, summary = coco_stats(self.data.coco, results, iou, image_ids=self.data.ids)
            stats.update({(k if iou == "bbox" else f"mask_{k}"): v for k, v in numbers.items()})
            text += f"{iou}:\n{summary}"
        return stats, text


def evaluate_detection(model, loader, data: CocoDetection, device, amp="none", progress=False):
    """(COCO numbers, summary text, all detections), the same on every rank."""
    return run_evaluation(model, loader, CocoScores(data, device), device, amp, progress, desc="detect")


class Detection(Task):
    """Object detection (and instance masks with Mask R-CNN) on COCO-format data; COCO AP validation."""

    name = "detection"
    command = "detect train"

    def build(self, config: DetectConfig, device, rank: int, world: int) -> Parts:
        masks = config.detector == "maskrcnn"
        train_set = coco_split(config.data, config.train_split, True, masks, config.hflip)
        self.val_set = coco_split(config.data, config.val_split, False, masks)
        if train_set.category_ids != self.val_set.category_ids:
            raise UsageError(
                f"train and val categories differ: {train_set.category_ids} vs {self.val_set.category_ids}"
            )
        val_loader = eval_loader(
            self.val_set, config.batch_size, config.workers, rank, world, collate_fn=collate_detection
        )
        model = build_detector(config, train_set.num_classes)
        return Parts(model, train_set, val_loader, collate_detection, train_set.class_names, pin_memory=False)

    def batch_loss(self, run: Run, batch) -> tuple[torch.Tensor, int]:
        images = [im.to(run.device, non_blocking=True) for im in batch[0]]
        targets = [{k: v.to(run.device) if torch.is_tensor(v) else v for k, v in t.items()} for t in batch[1]]
        with autocast(run.device, run.config.amp):
            losses = run.train_net(images, targets)
        return sum(v.float() for v in losses.values()), len(images)

    def evaluate(self, run: Run, epoch: int) -> dict:
        stats, _, _ = evaluate_detection(run.model, run.parts.val_loader, self.val_set, run.device, run.config.amp)
        return {f"val_{k}": v for k, v in stats.items() if k in ("AP", "AP50", "AP75", "mask_AP")}

    def run_info(self, run: Run) -> dict:
        train_set = run.parts.train_set
        return {
            "model": run.config.model,
            "detector": run.config.detector,
            "convert": run.config.convert,
            "weights": "model",
            "num_classes": train_set.num_classes,
            "category_ids": train_set.category_ids,
            "world_size": run.world,
            "device": str(run.device),
        }

    def summary(self, run: Run) -> str:
        train_set, config = run.parts.train_set, run.config
        params = sum(p.numel() for p in run.model.parameters())
        skipped = ", ".join(f"{n} {k}" for k, n in (train_set.skipped + self.val_set.skipped).items()) or "none"
        return (
            f"{config.detector} on {config.model}: {params:,} params, {len(train_set.category_ids)} categories, "
            f"{len(train_set)} train / {len(self.val_set)} val images (annotations skipped: {skipped}), "
            f"world {run.world}"
        )


def run_detect_train(config: DetectConfig) -> list[dict]:
    """`linvit detect train`: the whole run; returns the per-epoch metrics (rank 0 writes them to the output)."""
    return fit(Detection(), config)


def run_detect_eval(config: DetectEvalConfig) -> dict:
    """`linvit detect eval`: detections.json (COCO results format) and the 12 COCO numbers of a checkpoint."""
    with distributed_session(config.device) as (rank, world, device):
        config, folder = use_run_folder(config)  # --checkpoint RUN: the detector is rebuilt from the run's args.yaml
        masks = config.detector == "maskrcnn"
        split = config.split or "val2017"
        data = coco_split(config.data, split, False, masks, ann_file=config.ann_file, images=config.images)
        check_run_labels(folder, config.ann_file or config.data, category_ids=data.category_ids)
        model = build_detector(config, data.num_classes)
        if config.checkpoint:
            load_weights(model, config.checkpoint)
        model.to(device)
        loader = eval_loader(data, config.batch_size, config.workers, rank, world, collate_fn=collate_detection)
        progress = rank == 0 and config.progress
        stats, text, results = evaluate_detection(model, loader, data, device, config.amp, progress=progress)
        metrics = {**stats, "model": config.model, "detector": config.detector, "checkpoint": config.checkpoint}
        metrics.update({k: getattr(config, k) for k in ("min_size", "max_size", "anchor_base", "model_kwargs")})
        metrics.update(images=len(data), detections=len(results), skipped_annotations=dict(data.skipped))
        if rank == 0:
            print(text.rstrip())
            print("  ".join(f"{k} {stats[k]:.2f}" for k in STAT_NAMES))
            out = Path(config.output)
            out.mkdir(parents=True, exist_ok=True)
            (out / "detections.json").write_text(json.dumps(results))
            write_json(out / "metrics.json", metrics)
        return metrics
