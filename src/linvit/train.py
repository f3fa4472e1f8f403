"""Classification training with the DeiT recipe on ImageNet-layout folders, as a Task on the one trainer.

Built from timm's pieces: create_transform (RandAugment, random erasing), Mixup/CutMix with
SoftTargetCrossEntropy, create_optimizer_v2 (no weight decay on norms, biases, position embeddings
and InfSA discounts), a per-iteration cosine schedule with warm-up, ModelEmaV3. Resume, DDP, checkpoints
and the final model folder are linvit.engine's (fit).
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn as nn
import torch.nn.functional as F
from timm.data import Mixup, create_transform, resolve_data_config
from timm.loss import LabelSmoothingCrossEntropy, SoftTargetCrossEntropy
from timm.utils import ModelEmaV3
from torch.utils.data import Dataset

from .config import TrainConfig
from .conversion import convert_if_asked
from .data import collate_images
from .data.augment import fix_posterize
from .data.splits import open_split
from .distributed import all_reduce_sum
from .engine import Metric, Parts, Run, Task, eval_loader, fit, run_evaluation
from .errors import UsageError
from .models import create_variant
from .utils.runtime import autocast


@dataclasses.dataclass
class ClassifyConfig(TrainConfig):
    """`linvit train`: the DeiT recipe's defaults (300 epochs, lr 5e-4 per 512 images, RandAugment, Mixup 0.8,
    CutMix 1.0, random erasing 0.25, label smoothing 0.1, drop path 0.1)."""

    model: str | None = None
    model_kwargs: dict = dataclasses.field(default_factory=dict)
    pretrained: bool = False
    pretrained_file: str | None = None
    convert: str | None = None
    img_size: list[int] | None = None
    crop_pct: float | None = None
    train_split: str = "train"
    val_split: str = "val"
    epochs: int = 300
    base_lr: float = 5e-4
    min_lr: float | None = 1e-5
    warmup_lr: float | None = 1e-6
    warmup_epochs: int = 5
    drop_path: float = 0.1
    scale: list[float] = dataclasses.field(default_factory=lambda: [0.08, 1.0])
    ratio: list[float] = dataclasses.field(default_factory=lambda: [0.75, 4 / 3])
    hflip: float = 0.5
    aa: str | None = "rand-m9-mstd0.5-inc1"
    color_jitter: float = 0.3
    reprob: float = 0.25
    mixup: float = 0.8
    cutmix: float = 1.0
    smoothing: float = 0.1
    interpolation: str = "bicubic"
    model_ema: bool = False
    model_ema_decay: float = 0.99996


def build_datasets(config: ClassifyConfig, model: nn.Module) -> tuple[Dataset, Dataset, dict]:
    """(train, val, timm data config): the model's normalisation and crop, DeiT's training augmentations."""
    data_config = resolve_data_config(
        {"img_size": config.img_size, "crop_pct": config.crop_pct, "interpolation": config.interpolation},
        model=model,
    )
    train_tf = create_transform(
        **data_config,
        is_training=True,
        scale=tuple(config.scale),
        ratio=tuple(config.ratio),
        hflip=config.hflip,
        auto_augment=None if config.aa in (None, "none", "") else config.aa,
        color_jitter=config.color_jitter,
        re_prob=config.reprob,
        re_mode="pixel",
        re_count=1,
    )
    fix_posterize(train_tf)  # timm's Posterize at 0 bits raises on Pillow 13 (linvit.data.augment)
    train = open_split(config.data, config.train_split, train_tf, unreadable="replace")
    val = open_split(config.data, config.val_split, create_transform(**data_config, is_training=False))
    if train.classes != val.classes:
        hint = (
            ""
            if getattr(train, "names_classes", True)
            else "; numbered classes end at a split's highest label: name them (classes.txt, a ClassLabel)"
        )
        raise UsageError(f"train and val classes differ: {len(train.classes)} vs {len(val.classes)} classes{hint}")
    return train, val, data_config


def mixup_and_criterion(config: ClassifyConfig, num_classes: int) -> tuple[Mixup | None, nn.Module]:
    """DeiT's targets: Mixup/CutMix with soft-target cross-entropy, else (smoothed) cross-entropy."""
    if config.mixup > 0 or config.cutmix > 0:
        if config.batch_size % 2:
            raise UsageError(
                f"Mixup/CutMix pair the images of a batch: --batch-size must be even, got {config.batch_size}"
            )
        mixup = Mixup(
            mixup_alpha=config.mixup,
            cutmix_alpha=config.cutmix,
            label_smoothing=config.smoothing,
            num_classes=num_classes,
        )
        return mixup, SoftTargetCrossEntropy()
    if config.smoothing > 0:
        return None, LabelSmoothingCrossEntropy(smoothing=config.smoothing)
    return None, nn.CrossEntropyLoss()


# the model kwargs `linvit train` sets itself, and what sets each
SET_BY = {
    "img_size": "--img-size",
    "num_classes": "--data (its class count)",
    "drop_path_rate": "--drop-path",
    "pretrained_file": "--pretrained-file",
}


def with_model_kwargs(built: dict, extra: dict, set_by: dict = SET_BY) -> dict:
    """The kwargs train builds its model with, and --model-kwargs: a value train leaves open (None) is the
    kwarg's to give, but for img_size (--img-size sizes the data too); one train sets is refused in one line
    where the kwarg says otherwise (a duplicate keyword was a TypeError inside timm)."""
    for name, value in extra.items():
        own = built.get(name)
        if name == "img_size" and own is None:  # the model alone at that size would get data at its default
            raise UsageError(f"--model-kwargs img_size={value}: give it as --img-size (it sizes the data too)")
        if own is not None and _as_size(name, value) != _as_size(name, own):
            raise UsageError(
                f"--model-kwargs {name}={value}: {name} is set by {set_by[name]} ({own}); drop it from --model-kwargs"
            )
    return {**built, **extra}


def _as_size(name: str, value):
    """img_size as (H, W) (32, [32] and [32, 32] are one size); other values as they are."""
    if name != "img_size" or isinstance(value, str):
        return value
    sides = list(value) if isinstance(value, (list, tuple)) else [value]
    return tuple(sides * 2 if len(sides) == 1 else sides)


class ClassificationScores(Metric):
    """Summed cross-entropy, top-1 and top-5 hits. The sums stay on the device until the end (no host
    synchronisation per batch); each rank sees a disjoint shard (no padding duplicates), so the sums over
    ranks are the split's."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.sums = torch.zeros(3, dtype=torch.float64, device=device)  # loss, top-1 hits, top-5 hits
        self.count = self.skipped = 0

    def update(self, forward, batch) -> None:
        if batch is None:  # every image of the batch was unreadable
            return
        images, targets, bad = batch
        self.skipped += bad
        self.count += targets.numel()
        images, targets = images.to(self.device, non_blocking=True), targets.to(self.device, non_blocking=True)
        logits = forward(images).float()
        hits = logits.topk(min(5, logits.shape[1]), dim=1).indices == targets[:, None]
        loss = F.cross_entropy(logits, targets, reduction="sum")
        self.sums += torch.stack([loss, hits[:, 0].sum(), hits.any(dim=1).sum()]).double()

    def result(self) -> dict:
        loss_sum, top1, top5 = self.sums.tolist()
        totals = all_reduce_sum([loss_sum, top1, top5, self.count, self.skipped], self.device)
        loss_sum, top1, top5, count, skipped = totals
        if count == 0:
            raise UsageError("evaluation saw no readable images")
        return {
            "loss": loss_sum / count,
            "top1": 100.0 * top1 / count,
            "top5": 100.0 * top5 / count,
            "images": int(count),
            "skipped": int(skipped),
        }


def evaluate_classification(
    model: nn.Module, loader, device: torch.device, amp: str = "none", progress: bool = False
) -> dict:
    """Mean cross-entropy, top-1 and top-5 accuracy (%) over the loader, the same on every rank; also what
    `linvit eval` and distillation report."""
    return run_evaluation(model, loader, ClassificationScores(device), device, amp, progress)


class Classification(Task):
    """Image classification on class folders (or the drawn digits); top-1/top-5 validation, EMA optional."""

    name = "classification"
    command = "train"

    def __init__(self) -> None:
        self.replaced = torch.zeros((), dtype=torch.int64)  # undecodable training images replaced (this rank)

    def build(self, config: ClassifyConfig, device, rank: int, world: int) -> Parts:
        self.num_classes = len(open_split(config.data, config.train_split).classes)
        built = {
            "img_size": config.img_size,
            "num_classes": self.num_classes,
            "drop_path_rate": config.drop_path,
            "pretrained_file": config.pretrained_file,
        }
        model = create_variant(config.model, **with_model_kwargs(built, config.model_kwargs))
        self.conversion = convert_if_asked(model, config.convert)
        train_set, val_set, self.data_config = build_datasets(config, model)
        self.val_images = len(val_set)
        self.mixup, self.criterion = mixup_and_criterion(config, self.num_classes)
        val_loader = eval_loader(val_set, config.batch_size, config.workers, rank, world)
        return Parts(model, train_set, val_loader, collate_images, list(train_set.classes))

    def learning_rate(self, config: ClassifyConfig, world: int) -> float:
        """--lr, else DeiT's linear scaling: --base-lr per 512 images of the global batch."""
        return config.lr if config.lr is not None else config.base_lr * config.batch_size * world / 512

    def build_ema(self, model: nn.Module, config: ClassifyConfig):
        return ModelEmaV3(model, decay=config.model_ema_decay) if config.model_ema else None

    def batch_loss(self, run: Run, batch) -> tuple[torch.Tensor, int]:
        images, targets, passed_over = batch
        self.replaced.add_(passed_over)
        images, targets = images.to(run.device, non_blocking=True), targets.to(run.device, non_blocking=True)
        if self.mixup is not None:
            images, targets = self.mixup(images, targets)
        with autocast(run.device, run.config.amp):
            return self.criterion(run.train_net(images).float(), targets), len(images)

    def start_epoch(self, run: Run, epoch: int) -> None:
        self.replaced.zero_()
        super().start_epoch(run, epoch)  # drawn digit canvases: fresh ones each epoch, the same on resume

    def end_epoch(self, run: Run, epoch: int, numbers: dict) -> None:
        numbers["replaced_images"] = int(all_reduce_sum([int(self.replaced)], run.device)[0])
        if run.rank == 0 and numbers["replaced_images"]:
            print(f"epoch {epoch}: replaced {numbers['replaced_images']} undecodable training images")

    def evaluate(self, run: Run, epoch: int) -> dict:
        val = evaluate_classification(run.eval_net, run.parts.val_loader, run.device, run.config.amp)
        numbers = {"val_top1": val["top1"], "val_top5": val["top5"], "val_loss": val["loss"]}
        numbers["skipped_images"] = val["skipped"]
        if run.ema is not None:
            ema_val = evaluate_classification(run.ema.module, run.parts.val_loader, run.device, run.config.amp)
            numbers.update(val_top1_ema=ema_val["top1"], val_top5_ema=ema_val["top5"])
        return numbers

    def run_info(self, run: Run) -> dict:
        config = run.config
        return {
            "model": config.model,
            "convert": config.convert,
            "pretrained_file": config.pretrained_file,
            "conversion": self.conversion,
            "weights": "ema" if run.ema is not None else "model",
            "lr": self.learning_rate(config, run.world),
            "global_batch": config.batch_size * run.world,
            "world_size": run.world,
            "num_classes": self.num_classes,
            "data_config": self.data_config,
            "device": str(run.device),
        }

    def summary(self, run: Run) -> str:
        config = run.config
        name = f"{config.model} -> {config.convert}" if self.conversion else config.model
        params = sum(p.numel() for p in run.model.parameters())
        images = f"{len(run.parts.train_set)} train / {self.val_images} val images"
        lr = self.learning_rate(config, run.world)
        return f"{name}: {params:,} params, {self.num_classes} classes, {images}, lr {lr:.3g}, world {run.world}"


def run_train(config: ClassifyConfig) -> list[dict]:
    """`linvit train`: the whole run; returns the per-epoch metrics (rank 0 writes them to config.output)."""
    return fit(Classification(), config)
