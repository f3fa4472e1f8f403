"""`linvit train`: classification as a Task on the one trainer, and the top-1 / top-5 / loss Metric.

ClassificationScores is also what `linvit eval` and an image teacher's distillation report. Resume, DDP,
checkpoints and the final model folder are linvit.engine's (fit).
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from timm.utils import ModelEmaV3

from ..conversion import convert_if_asked
from ..data import collate_images
from ..data.splits import open_split
from ..distributed import all_reduce_sum
from ..engine import Metric, Parts, Run, Task, eval_loader, fit, run_evaluation
from ..errors import UsageError
from ..models import create_variant
from ..utils.runtime import autocast
from .config import ClassifyConfig, with_model_kwargs
from .data import build_datasets, mixup_and_criterion


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
        classes = open_split(config.data, config.train_split).classes
        if len(classes) < 2:  # cross-entropy over one class is 0 from the first step: 100% that means nothing
            found = f"one class ({classes[0]})" if classes else "no class"
            raise UsageError(f"{config.data}: {found}; a classifier needs two or more to learn from")
        self.num_classes = len(classes)
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
