"""What `linvit explain | spectral | erf` run on: a model (a run folder, or a name with optional weights) and
images (an ImageNet-layout split, any folder of pictures, or a reader spec every other command takes:
`digits:TASK,...`, `wds:FOLDER`, `hfds:FOLDER`), with labels only where they mean something.

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
from ..data.splits import is_reader_spec, open_split
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
    seed: int = 0  # the model's initialisation without a checkpoint, and the figures' class-spread order


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
    drawn_boxes: list | None = None  # per image (boxes, (width, height)) or None: a reader's own (the digits')


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


class FolderPictures:
    """Any folder of pictures (DATA/SPLIT, else DATA), in class folders or not; boxes come from a boxes file."""

    def __init__(self, config: AnalysisConfig) -> None:
        self.root = image_root(config)
        self.paths = find_images([self.root])
        self.classes = class_folders(self.root, self.paths)
        self.names = [str(p) for p in self.paths]

    def read(self, index: int, transform) -> tuple[torch.Tensor, str | None] | None:
        """(image, its class folder or None), or None for an undecodable file (passed over, as evaluation does)."""
        path = self.paths[index]
        try:
            image = transform(read_rgb(path))
        except UsageError as err:
            print(f"skipped {err}")
            return None
        return image, path.relative_to(self.root).parts[0] if self.classes else None

    def boxes(self, index: int) -> None:
        return None


class SplitPictures:
    """The split of a reader spec (data.splits.open_split, as train and eval read it): its items, their class
    names, and the digits' own ink boxes."""

    def __init__(self, config: AnalysisConfig) -> None:
        self.split = open_split(config.data, config.split)
        self.classes = list(self.split.classes)
        self.names = [f"{config.data}#{config.split}/{i}" for i in range(len(self.split))]

    def read(self, index: int, transform) -> tuple[torch.Tensor, str] | None:
        self.split.transform = transform
        item = self.split[index]
        return None if item is None else (item[0], self.classes[int(item[1])])

    def boxes(self, index: int) -> tuple[list, tuple[int, int]] | None:
        ink = getattr(self.split, "ink_boxes", None)
        return None if ink is None else (ink(index), (self.split.canvas, self.split.canvas))


def spread_order(classes: list[str | None], seed: int) -> list[int]:
    """Positions taken a class at a time in turn (each class's own in a seeded shuffle), so the first few, which
    the figures show, spread over the classes of a class-sorted split; a seeded shuffle without classes."""
    rng = np.random.default_rng(seed)
    lanes: dict = {}
    for position, name in enumerate(classes):
        lanes.setdefault(name, []).append(position)
    shuffled = [rng.permutation(lanes[name]).tolist() for name in sorted(lanes, key=str)]
    return [lane[r] for r in range(max(map(len, shuffled))) for lane in shuffled if r < len(lane)]


def load_inputs(settings: AnalysisConfig) -> AnalysisInputs:
    """Model, up to settings.limit images spread evenly over the split (sorted), in class-spread order
    (spread_order), their labels where they mean something, and the data config they were transformed with."""
    pictures = SplitPictures(settings) if is_reader_spec(settings.data) else FolderPictures(settings)
    settings, run = run_settings(settings)
    model, label_names = _create(settings, run, pictures.classes)
    mapping, why = match_labels(pictures.classes, label_names, getattr(model, "num_classes", 0))
    config = data_config(settings, model)
    transform = create_transform(**config, is_training=False)
    count = len(pictures.names)
    picked = np.linspace(0, count - 1, min(settings.limit, count)).round().astype(int).tolist()
    read = [(i, pictures.read(i, transform)) for i in dict.fromkeys(picked)]
    read = [(i, *item) for i, item in read if item is not None]
    if not read:
        raise UsageError(f"{settings.data}: no readable images")
    read = [read[k] for k in spread_order([name for _, _, name in read], settings.seed)]
    images = torch.stack([image for _, image, _ in read])
    targets = None if mapping is None else torch.tensor([mapping[name] for _, _, name in read])
    paths = [pictures.names[i] for i, _, _ in read]
    drawn = [pictures.boxes(i) for i, _, _ in read]
    drawn = drawn if any(b is not None for b in drawn) else None
    return AnalysisInputs(model, images, targets, paths, config, why, settings, drawn)


def data_config(settings: AnalysisConfig, model: nn.Module) -> dict:
    """timm's eval data config with --img-size (one side or H W) and --crop-pct applied."""
    overrides = {"crop_pct": settings.crop_pct}
    if settings.img_size is not None:
        overrides["input_size"] = (3, *height_width(settings.img_size))
    return resolve_data_config(overrides, model=model)
