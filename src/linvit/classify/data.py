"""DeiT's data recipe: the model's normalisation and crop, timm's training augmentations, Mixup/CutMix targets.

Every --data spelling (class folders, WebDataset shards, Hugging Face datasets, the drawn digits) opens through
linvit.data.splits, so the recipe is the same on each.
"""

from __future__ import annotations

import torch.nn as nn
from timm.data import Mixup, create_transform, resolve_data_config
from timm.loss import LabelSmoothingCrossEntropy, SoftTargetCrossEntropy
from torch.utils.data import Dataset

from ..data.augment import fix_posterize
from ..data.splits import open_split
from ..errors import UsageError
from .config import ClassifyConfig


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
        only_train = [c for c in train.classes if c not in val.classes][:3]
        only_val = [c for c in val.classes if c not in train.classes][:3]
        which = f"only in train {only_train}, only in val {only_val}" if only_train or only_val else "another order"
        raise UsageError(
            f"train and val classes differ ({which}): {len(train.classes)} vs {len(val.classes)} classes{hint}"
        )
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
