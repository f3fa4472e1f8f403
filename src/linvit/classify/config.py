"""`linvit train`'s configuration, and how --model-kwargs meets the kwargs train sets itself.

Apart from the engine so that data.py takes the config without an import circle; with_model_kwargs also checks a
timm teacher's --model-kwargs (linvit.distillation).
"""

from __future__ import annotations

import dataclasses

from ..config import TrainConfig
from ..errors import UsageError


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
