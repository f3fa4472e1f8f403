"""What `linvit explain | spectral | erf` run on: a model (a run folder, or a name with optional weights) and
images (an ImageNet-layout split, or any folder of pictures), with labels only where they mean something.

Labels are used only when the folder's class names can be matched to the model's classes: by name when the
model knows its label names (a run folder), else by position when the folder has as many classes as the model
has outputs (torchvision's ImageFolder order). A one-output model, a plain folder of pictures or class
folders the model does not know give maps only: no accuracy, MoRF/LeRF or other number computed from nothing.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TypeVar

import numpy as np
import torch
import torch.nn as nn
from timm.data import create_transform, resolve_data_config

from ..config import Config
from ..data.images import find_images, read_rgb
from ..errors import UsageError
from ..weights import create_for_checkpoint, height_width, load_weights, read_run_config, use_run_folder


@dataclasses.dataclass
class AnalysisConfig(Config):
    """What explain, spectral and erf share: the pictures, the model (a run folder, or a name with optional
    weights) and the input size."""

    data: str | None = None
    split: str = "val"  # DATA/SPLIT when it exists, else DATA itself
    model: str | None = None  # without it, checkpoint is a run folder
    model_kwargs: dict = dataclasses.field(default_factory=dict)
    pretrained: bool = False  # the CLI folds it into model_kwargs
    checkpoint: str | None = None
    img_size: list[int] | None = None  # one side or H W; None: the model's (a run's own)
    crop_pct: float | None = None
    limit: int = 64  # images, spread evenly over the split
    seed: int = 0  # the model's initialisation without a checkpoint


A = TypeVar("A", bound=AnalysisConfig)


@dataclasses.dataclass
class AnalysisInputs:
    """images (B, 3, H, W) normalised; targets (B,) or None when unlabelled; why_unlabelled says why;
    settings is the config with a run folder's model and input size filled in."""

    model: nn.Module
    images: torch.Tensor
    targets: torch.Tensor | None
    paths: list[str]
    config: dict
    why_unlabelled: str | None = None
    settings: AnalysisConfig | None = None


def image_root(config: AnalysisConfig) -> Path:
    """DATA/SPLIT when it exists, else DATA itself (any folder of pictures)."""
    if config.data is None:
        raise UsageError("give --data DIR (a folder of pictures)")
    root = Path(config.data) / config.split
    if root.is_dir():
        return root
    if Path(config.data).is_dir():
        return Path(config.data)
    raise UsageError(f"{config.data}: no such folder")


def class_folders(root: Path, paths: list[Path]) -> list[str] | None:
    """The class names when every picture sits in a class folder directly below root (ImageFolder layout)."""
    parents = {p.relative_to(root).parts[0] for p in paths if len(p.relative_to(root).parts) == 2}
    if not parents or any(len(p.relative_to(root).parts) != 2 for p in paths):
        return None
    return sorted(parents)


def run_settings(config: A) -> tuple[A, dict | None]:
    """config with a run folder's model, kwargs and input size (unless given) filled in, and the run's
    config.json; (config, None) for a model name, with or without a weights file."""
    found = read_run_config(config.checkpoint) if config.checkpoint else None
    if found is not None:
        return use_run_folder(config)[0], found[1]
    if config.model is None:
        if config.checkpoint:
            raise UsageError(f"{config.checkpoint}: not in a linvit run folder; give --model NAME for its weights")
        raise UsageError("give --model NAME, or --checkpoint RUN (a run folder)")
    return config, None


def build_model(config: AnalysisConfig, folder_classes: list[str] | None) -> tuple[nn.Module, list[str] | None]:
    """The model and its label names: a run folder's own (--checkpoint RUN), else --model with the folder's
    class count (at least 2) and --checkpoint weights if given."""
    config, run = run_settings(config)
    return _create(config, run, folder_classes)


def _create(config: AnalysisConfig, run: dict | None, folder_classes: list[str] | None):
    names = run.get("label_names") if run else None
    num_classes = run.get("num_classes") if run else None
    if num_classes is None and folder_classes and len(folder_classes) >= 2:
        num_classes = len(folder_classes)
    torch.manual_seed(config.seed)  # random-init analyses are reproducible too
    kwargs = {} if num_classes is None else {"num_classes": num_classes}
    model = create_for_checkpoint(config.model, config.checkpoint, config.img_size, **{**kwargs, **config.model_kwargs})
    if config.checkpoint:
        load_weights(model, config.checkpoint)
    return model.eval(), names


def match_labels(
    folder_classes: list[str] | None, label_names: list[str] | None, num_outputs: int
) -> tuple[dict[str, int] | None, str | None]:
    """Folder class -> model class, or None and the reason the pictures count as unlabelled."""
    if folder_classes is None:
        return None, "the pictures are not in class folders"
    if num_outputs < 2:
        return None, "the model has one output: any accuracy would be 100% by construction"
    if label_names:
        unknown = [c for c in folder_classes if c not in label_names]
        if unknown:
            return None, f"class folders the model does not know: {', '.join(unknown[:5])}"
        return {c: label_names.index(c) for c in folder_classes}, None
    if len(folder_classes) != num_outputs:
        return None, f"{len(folder_classes)} class folders for a model with {num_outputs} outputs"
    return {c: i for i, c in enumerate(folder_classes)}, None


def load_inputs(settings: AnalysisConfig) -> AnalysisInputs:
    """Model, up to settings.limit images spread evenly over the folder (sorted paths), their labels where they
    mean something, and the data config they were transformed with."""
    root = image_root(settings)
    paths = find_images([root])
    folder_classes = class_folders(root, paths)
    settings, run = run_settings(settings)
    model, label_names = _create(settings, run, folder_classes)
    mapping, why = match_labels(folder_classes, label_names, getattr(model, "num_classes", 0))
    config = data_config(settings, model)
    transform = create_transform(**config, is_training=False)
    picked = np.linspace(0, len(paths) - 1, min(settings.limit, len(paths))).round().astype(int).tolist()
    chosen, images = [], []
    for i in dict.fromkeys(picked):
        try:
            images.append(transform(read_rgb(paths[i])))
        except UsageError as err:  # an undecodable file is passed over, as evaluation does
            print(f"skipped {err}")
            continue
        chosen.append(paths[i])
    if not images:
        raise UsageError(f"{root}: no readable images")
    images = torch.stack(images)
    targets = None
    if mapping is not None:
        targets = torch.tensor([mapping[p.relative_to(root).parts[0]] for p in chosen])
    return AnalysisInputs(model, images, targets, [str(p) for p in chosen], config, why, settings)


def data_config(settings: AnalysisConfig, model: nn.Module) -> dict:
    """timm's eval data config with --img-size (one side or H W) and --crop-pct applied."""
    overrides = {"crop_pct": settings.crop_pct}
    if settings.img_size is not None:
        overrides["input_size"] = (3, *height_width(settings.img_size))
    return resolve_data_config(overrides, model=model)
