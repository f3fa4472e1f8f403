"""Two digit tasks rendered on the fly, for experiments that must converge in CPU minutes (issue 23).

All 5,000 bundled MNIST digits are split once, per class and disjointly, into train / val / test (400 / 50 / 50
per class). Canvases are rendered from an item's own random stream, seeded by (seed, split, epoch, index):
training sees fresh placements and clutter every epoch, reproducibly (a resumed run renders the same epoch
again), while val, test and the shifted test are fixed (their epoch is always 0).

Tasks:
    digit  one digit among clutter; the label is the digit.
    sum    two digits in opposite halves of the canvas (at least canvas / 2 apart, centre to centre); the
           label is (a + b) mod 10, so no single region decides it: a mixer must relate distant tokens.

The shifted test set (the papers' ImageNet-V2 row) keeps the test digits and classes and changes how they are
drawn, fixed before any model is trained: twice the clutter plus two fragments, digits scaled to 70-85%, and
ink contrast 45-70% of full, against 1.0 / 1.0 for the other splits.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset

from ..errors import UsageError
from .cluttered_mnist import DIGIT, FRAGMENT, load_mnist_5k

PREFIX = "digits:"  # `--data digits:TASK[,canvas=48][,clutter=2][,seed=0]` selects these tasks in train / eval
SPLITS = ("train", "val", "test", "shifted")
PER_CLASS = {"train": 400, "val": 50, "test": 50}
TASKS = ("digit", "sum")


@dataclass(frozen=True)
class Drawing:
    """How canvases of a split are drawn: clutter fragments, digit scale range and ink contrast range."""

    clutter: int
    scale: tuple[float, float] = (1.0, 1.0)
    contrast: tuple[float, float] = (1.0, 1.0)


def drawing_for(split: str, clutter: int) -> Drawing:
    """The standard drawing, or the shifted test set's (see the module docstring)."""
    if split == "shifted":
        return Drawing(clutter=2 * clutter + 2, scale=(0.70, 0.85), contrast=(0.45, 0.70))
    return Drawing(clutter=clutter)


def split_digits(labels: np.ndarray, seed: int = 0) -> dict[str, np.ndarray]:
    """Indices of the digits of each split (shifted uses test's): disjoint, per class, shuffled by seed."""
    rng = np.random.default_rng(seed)
    parts: dict[str, list[np.ndarray]] = {name: [] for name in PER_CLASS}
    for cls in range(10):
        idx = rng.permutation(np.flatnonzero(labels == cls))
        start = 0
        for name, count in PER_CLASS.items():
            parts[name].append(idx[start : start + count])
            start += count
        if start > len(idx):
            raise UsageError(f"class {cls} has {len(idx)} digits, fewer than the {start} the splits need")
    out = {name: np.sort(np.concatenate(chunks)) for name, chunks in parts.items()}
    out["shifted"] = out["test"]
    return out


def item_rng(seed: int, split: str, epoch: int, index: int) -> np.random.Generator:
    """The random stream of one canvas: the same (seed, split, epoch, index) always draws the same canvas."""
    return np.random.default_rng([seed, zlib.crc32(split.encode()), epoch, index])


def scaled(digit: np.ndarray, scale: float, contrast: float) -> np.ndarray:
    """The digit resized by scale (bilinear) with its ink multiplied by contrast."""
    side = max(8, round(DIGIT * scale))
    image = Image.fromarray(digit).resize((side, side), Image.BILINEAR) if side != DIGIT else Image.fromarray(digit)
    return (np.asarray(image, dtype=np.float32) * contrast).round().clip(0, 255).astype(np.uint8)


def draw_clutter(canvas: np.ndarray, pool: np.ndarray, count: int, contrast: float, rng) -> None:
    """count fragments of random pool digits, maximum-blended in place."""
    side = canvas.shape[0]
    for _ in range(count):
        src = pool[rng.integers(len(pool))]
        sy, sx = rng.integers(0, DIGIT - FRAGMENT + 1, size=2)
        frag = (src[sy : sy + FRAGMENT, sx : sx + FRAGMENT] * contrast).astype(np.uint8)
        y, x = rng.integers(0, side - FRAGMENT + 1, size=2)
        np.maximum(canvas[y : y + FRAGMENT, x : x + FRAGMENT], frag, out=canvas[y : y + FRAGMENT, x : x + FRAGMENT])


def place(canvas: np.ndarray, digit: np.ndarray, y: int, x: int) -> None:
    h, w = digit.shape
    np.maximum(canvas[y : y + h, x : x + w], digit, out=canvas[y : y + h, x : x + w])


class DigitCanvases(Dataset):
    """Items (image, label, 0) of one split, the item format of linvit's image folders (0 undecodable files
    passed over: canvases are drawn, never decoded), so training and evaluation loaders take them unchanged.
    The image is transform(PIL RGB canvas) when a transform is given, else a (3, canvas, canvas) float tensor
    in [0, 1].

    Args:
        split: train | val | test | shifted.
        task: "digit" or "sum".
        canvas: side in pixels (sum needs at least 2 * 28 + 8 so two digits fit apart).
        clutter: fragments per canvas on the standard splits.
        seed: the digit split and every canvas's stream.
        length: items per epoch (default: the split's digit count).
        transform: applied to the RGB canvas (timm's train or eval transform).
    """

    def __init__(
        self,
        split: str,
        task: str = "digit",
        canvas: int = 48,
        clutter: int = 2,
        seed: int = 0,
        length: int | None = None,
        transform=None,
    ) -> None:
        if split not in SPLITS or task not in TASKS:
            raise UsageError(f"split in {SPLITS} and task in {TASKS}; got {split!r}, {task!r}")
        if canvas < (2 * DIGIT + 8 if task == "sum" else DIGIT):
            raise UsageError(
                f"the {task} task needs a canvas of at least {2 * DIGIT + 8 if task == 'sum' else DIGIT} px"
            )
        digits, labels = load_mnist_5k()
        chosen = split_digits(labels, seed)[split]
        self.digits, self.labels = digits[chosen], labels[chosen]
        self.clutter_pool = digits[split_digits(labels, seed)["train" if split == "train" else split]]
        self.split, self.task, self.canvas, self.seed, self.transform = split, task, canvas, seed, transform
        self.classes = [str(d) for d in range(10)]
        self.drawing = drawing_for(split, clutter)
        self.length = length or len(chosen)
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """Fresh canvases for training epochs; the evaluation splits stay fixed."""
        self.epoch = epoch if self.split == "train" else 0

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int):
        rng = item_rng(self.seed, self.split, self.epoch, index)
        image, label = self.render(index, rng)
        if self.transform is not None:
            return self.transform(Image.fromarray(image).convert("RGB")), label, 0
        return torch.from_numpy(image).float().div_(255).expand(3, -1, -1).clone(), label, 0

    def render(self, index: int, rng: np.random.Generator) -> tuple[np.ndarray, int]:
        """(canvas (H, W) uint8, label) of one item."""
        d = self.drawing
        canvas = np.zeros((self.canvas, self.canvas), dtype=np.uint8)
        draw_clutter(canvas, self.clutter_pool, d.clutter, float(rng.uniform(*d.contrast)), rng)
        first = index % len(self.digits)
        picks = [first] if self.task == "digit" else [first, int(rng.integers(len(self.digits)))]
        drawn = [scaled(self.digits[i], float(rng.uniform(*d.scale)), float(rng.uniform(*d.contrast))) for i in picks]
        if self.task == "digit":
            side = drawn[0].shape[0]
            place(canvas, drawn[0], *rng.integers(0, self.canvas - side + 1, size=2))
            return canvas, int(self.labels[first])
        for (y, x), digit in zip(self.far_apart(drawn, rng), drawn, strict=True):
            place(canvas, digit, y, x)
        return canvas, int((self.labels[picks[0]] + self.labels[picks[1]]) % 10)

    def far_apart(self, drawn: list[np.ndarray], rng: np.random.Generator) -> list[tuple[int, int]]:
        """Top-left corners of two digits in opposite halves (left/right or top/bottom, chosen at random),
        at least half the canvas apart centre to centre."""
        half = self.canvas // 2
        while True:
            corners = []
            vertical = bool(rng.integers(2))
            for k, digit in enumerate(drawn):
                side = digit.shape[0]
                lo, hi = (0, half - side) if k == 0 else (half, self.canvas - side)
                along = int(rng.integers(lo, hi + 1))
                across = int(rng.integers(0, self.canvas - side + 1))
                corners.append((along, across) if vertical else (across, along))
            centres = [(y + d.shape[0] / 2, x + d.shape[1] / 2) for (y, x), d in zip(corners, drawn, strict=True)]
            if np.hypot(centres[0][0] - centres[1][0], centres[0][1] - centres[1][1]) >= half:
                return corners


def is_digits_spec(data) -> bool:
    return str(data).startswith(PREFIX)


def parse_digits_spec(data: str) -> dict:
    """ "digits:sum,canvas=64,clutter=2,seed=0" -> DigitCanvases keyword arguments (task, canvas, clutter, seed)."""
    task, *options = str(data)[len(PREFIX) :].split(",")
    kwargs: dict = {"task": task or "digit"}
    for option in options:
        key, sep, value = option.partition("=")
        if not sep or key not in ("canvas", "clutter", "seed", "length"):
            raise UsageError(f"--data {data}: options are canvas=, clutter=, seed=, length= (got {option!r})")
        try:
            kwargs[key] = int(value)
        except ValueError as err:
            raise UsageError(f"--data {data}: {key} takes an integer, got {value!r}") from err
    if kwargs["task"] not in TASKS:
        raise UsageError(f"--data {data}: the task is one of {', '.join(TASKS)}, got {kwargs['task']!r}")
    return kwargs


def digits_split(data: str, split: str, transform=None) -> DigitCanvases:
    """The split of a `digits:` data spec (length= applies to training only)."""
    kwargs = parse_digits_spec(data)
    if split != "train":
        kwargs.pop("length", None)
    return DigitCanvases(split, transform=transform, **kwargs)
