"""What `linvit explain | spectral | erf` run on: a model (a run folder, or a name with optional weights) and
images (an ImageNet-layout split, or any folder of pictures), with labels only where they mean something.

Labels are used only when the folder's class names can be matched to the model's classes: by name when the
model knows its label names (a run folder), else by position when the folder has as many classes as the model
has outputs (torchvision's ImageFolder order). A one-output model, a plain folder of pictures or class
folders the model does not know give maps only: no accuracy, MoRF/LeRF or other number computed from nothing.
"""

from __future__ import annotations

from argparse import Namespace
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
from timm.data import create_transform, resolve_data_config

from ..data.images import find_images, read_rgb
from ..errors import UsageError
from ..evaluate import create_for_checkpoint, height_width, load_weights
from ..utils.artifacts import read_run_config, use_run_folder


@dataclass
class AnalysisInputs:
    """images (B, 3, H, W) normalised; targets (B,) or None when unlabelled; why_unlabelled says why."""

    model: nn.Module
    images: torch.Tensor
    targets: torch.Tensor | None
    paths: list[str]
    config: dict
    why_unlabelled: str | None = None


def image_root(args: Namespace) -> Path:
    """DATA/SPLIT when it exists, else DATA itself (any folder of pictures)."""
    root = Path(args.data) / args.split
    if root.is_dir():
        return root
    if Path(args.data).is_dir():
        return Path(args.data)
    raise UsageError(f"{args.data}: no such folder")


def class_folders(root: Path, paths: list[Path]) -> list[str] | None:
    """The class names when every picture sits in a class folder directly below root (ImageFolder layout)."""
    parents = {p.relative_to(root).parts[0] for p in paths if len(p.relative_to(root).parts) == 2}
    if not parents or any(len(p.relative_to(root).parts) != 2 for p in paths):
        return None
    return sorted(parents)


def build_model(args: Namespace, folder_classes: list[str] | None) -> tuple[nn.Module, list[str] | None]:
    """The model and its label names: a run folder's own (--checkpoint RUN), else --model with the folder's
    class count (at least 2) and --checkpoint weights if given."""
    names, num_classes = None, None
    found = read_run_config(args.checkpoint) if args.checkpoint else None
    if found is not None:
        use_run_folder(args)  # the run's model, kwargs and input size unless given
        names, num_classes = found[1].get("label_names"), found[1].get("num_classes")
    elif args.model is None:
        if args.checkpoint:
            raise UsageError(f"{args.checkpoint}: not in a linvit run folder; give --model NAME for its weights")
        raise UsageError("give --model NAME, or --checkpoint RUN (a run folder)")
    if num_classes is None and folder_classes and len(folder_classes) >= 2:
        num_classes = len(folder_classes)
    torch.manual_seed(args.seed)  # random-init analyses are reproducible too
    kwargs = {} if num_classes is None else {"num_classes": num_classes}
    model = create_for_checkpoint(args.model, args.checkpoint, args.img_size, **{**kwargs, **args.model_kwargs})
    if args.checkpoint:
        load_weights(model, args.checkpoint)
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


def load_inputs(args: Namespace, limit: int) -> AnalysisInputs:
    """Model, up to limit images spread evenly over the folder (sorted paths), their labels where they mean
    something, and the data config they were transformed with."""
    root = image_root(args)
    paths = find_images([root])
    folder_classes = class_folders(root, paths)
    model, label_names = build_model(args, folder_classes)
    mapping, why = match_labels(folder_classes, label_names, getattr(model, "num_classes", 0))
    config = data_config(args, model)
    transform = create_transform(**config, is_training=False)
    picked = np.linspace(0, len(paths) - 1, min(limit, len(paths))).round().astype(int).tolist()
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
    return AnalysisInputs(model, images, targets, [str(p) for p in chosen], config, why)


def data_config(args: Namespace, model: nn.Module) -> dict:
    """timm's eval data config with --img-size (one side or H W) and --crop-pct applied."""
    overrides = {"crop_pct": args.crop_pct}
    if args.img_size is not None:
        overrides["input_size"] = (3, *height_width(args.img_size))
    return resolve_data_config(overrides, model=model)
