"""Two digit tasks rendered on the fly, for experiments that must converge in CPU minutes (issue 23).

All 5,000 bundled MNIST digits are split once, per class and disjointly, into train / val / test (400 / 50 / 50
per class). Canvases are rendered from an item's own random stream, seeded by (seed, split, epoch, index):
training sees fresh placements and clutter every epoch, reproducibly (a resumed run renders the same epoch
again), while val, test and the shifted test are fixed (their epoch is always 0).

Tasks:
    digit  one digit among clutter; the label is the digit.
    max    two digits in opposite halves of the canvas (left/right or top/bottom, at least canvas / 2 apart centre
           to centre, each near its half's middle line); the label is max(a, b): a model that reads only one of
           them is right at most 55% of the time (it must guess its own digit), so the rest needs relating
           distant tokens, and every recognised large digit already pays.
    sum    the same two digits, label (a + b) mod 10: one digit alone says nothing (10%), but a 4-layer ViT
           from scratch stays at chance for 12 epochs of 4,000 canvases (canvas 64, patch 16), so the
           experiments use max.

The shifted test set (the papers' ImageNet-V2 row) keeps the test digits and classes and changes how they are
drawn, fixed before any model is trained: twice the clutter plus two fragments, digits scaled to 70-85%, and
ink contrast 45-70% of full, against 1.0 / 1.0 for the other splits.
"""

from __future__ import annotations

import json
import zlib
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset
from tqdm import tqdm

from ..config import Config
from ..errors import UsageError
from .cluttered_mnist import DIGIT, FRAGMENT, load_mnist_5k

PREFIX = "digits:"  # `--data digits:TASK[,canvas=48][,clutter=2][,seed=0]` selects these tasks in train / eval
SPLITS = ("train", "val", "test", "shifted")
PER_CLASS = {"train": 400, "val": 50, "test": 50}
TASKS = ("digit", "max", "sum")
TWO_DIGITS = ("max", "sum")
JITTER = 16  # two-digit tasks: a digit's centre stays within canvas / JITTER of the middle line across


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


def balanced_order(labels: np.ndarray, seed: int, split: str, epoch: int, lap: int) -> np.ndarray:
    """A seeded permutation of a split's digits whose every prefix holds each class in the split's proportion
    (to within one digit): each class is shuffled, its j-th digit keyed (j + u) / count with u uniform in
    [0, 1), and the keys sorted. A length below the split's size then sees every class, evenly; lap counts
    the passes over the split that a longer length makes within one epoch."""
    rng = np.random.default_rng([seed, zlib.crc32(split.encode()), epoch, lap, 0x6C656E])
    keys = np.empty(len(labels))
    for cls in np.unique(labels):
        members = rng.permutation(np.flatnonzero(labels == cls))
        keys[members] = (np.arange(len(members)) + rng.random(len(members))) / len(members)
    return np.argsort(keys, kind="stable")


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


def task_label(task: str, digits: list[int]) -> int:
    """The label of a canvas showing these digits: the digit, max(a, b) or (a + b) mod 10."""
    return max(digits) if task == "max" else sum(digits) % 10


def ink_box(digit: np.ndarray, y: int, x: int) -> list[int]:
    """[x0, y0, x1, y1] (max exclusive) tight around the digit's ink, placed at (y, x)."""
    rows, cols = np.nonzero(digit)
    return [int(x + cols.min()), int(y + rows.min()), int(x + cols.max() + 1), int(y + rows.max() + 1)]


class DigitCanvases(Dataset):
    """Items (image, label, 0) of one split, the item format of linvit's image folders (0 undecodable files
    passed over: canvases are drawn, never decoded), so training and evaluation loaders take them unchanged.
    The image is transform(PIL RGB canvas) when a transform is given, else a (3, canvas, canvas) float tensor
    in [0, 1].

    Args:
        split: train | val | test | shifted.
        task: "digit", "max" or "sum".
        canvas: side in pixels (max and sum need at least 2 * 28 + 8 so two digits fit apart).
        clutter: fragments per canvas on the standard splits.
        seed: the digit split and every canvas's stream.
        length: items per epoch (default: the split's digit count, each digit once). Any other length draws its
            digits from a class-balanced permutation of the whole split, fresh for each seed and epoch
            (balanced_order), so a short epoch still sees every class in the split's proportion.
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
        smallest = 2 * DIGIT + 8 if task in TWO_DIGITS else DIGIT
        if canvas < smallest:
            raise UsageError(f"the {task} task needs a canvas of at least {smallest} px")
        digits, labels = load_mnist_5k()
        chosen = split_digits(labels, seed)[split]
        self.digits, self.labels = digits[chosen], labels[chosen]
        self.clutter_pool = digits[split_digits(labels, seed)["train" if split == "train" else split]]
        self.split, self.task, self.canvas, self.seed, self.transform = split, task, canvas, seed, transform
        self.classes = [str(d) for d in range(10)]
        self.drawing = drawing_for(split, clutter)
        self.length = length or len(chosen)
        self.epoch = 0
        self._orders: dict[tuple[int, int], np.ndarray] = {}  # (epoch, lap) -> balanced_order; a pure function

    def digit_of(self, index: int) -> int:
        """The split digit that item index shows first: itself at the split's own length, else its place in
        the epoch's class-balanced order (a pure function of seed, split, epoch and index, so resuming or
        sharding by rank draws the same digits)."""
        count = len(self.digits)
        if self.length == count:
            return index
        key = (self.epoch, index // count)
        if key not in self._orders:
            self._orders = {key: balanced_order(self.labels, self.seed, self.split, *key)}  # one epoch's lap kept
        return int(self._orders[key][index % count])

    def set_epoch(self, epoch: int) -> None:
        """Fresh canvases for training epochs; the evaluation splits stay fixed."""
        self.epoch = epoch if self.split == "train" else 0

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int):
        rng = item_rng(self.seed, self.split, self.epoch, index)
        image, label, _ = self.render(index, rng)
        if self.transform is not None:
            return self.transform(Image.fromarray(image).convert("RGB")), label, 0
        return torch.from_numpy(image).float().div_(255).expand(3, -1, -1).clone(), label, 0

    def ink_boxes(self, index: int) -> list[list[int]]:
        """The boxes of item index's deciding digits (canvas pixels), as write_digit_folder's boxes.json has them."""
        return self.render(index, item_rng(self.seed, self.split, self.epoch, index))[2]

    def render(self, index: int, rng: np.random.Generator) -> tuple[np.ndarray, int, list[list[int]]]:
        """(canvas (H, W) uint8, label, ink boxes [x0, y0, x1, y1] of the digits that decide the label)."""
        d = self.drawing
        canvas = np.zeros((self.canvas, self.canvas), dtype=np.uint8)
        draw_clutter(canvas, self.clutter_pool, d.clutter, float(rng.uniform(*d.contrast)), rng)
        first = self.digit_of(index)
        picks = [first] if self.task == "digit" else [first, int(rng.integers(len(self.digits)))]
        drawn = [scaled(self.digits[i], float(rng.uniform(*d.scale)), float(rng.uniform(*d.contrast))) for i in picks]
        if self.task == "digit":
            side = drawn[0].shape[0]
            corners = [tuple(int(v) for v in rng.integers(0, self.canvas - side + 1, size=2))]
        else:
            corners = self.far_apart(drawn, rng)
        for (y, x), digit in zip(corners, drawn, strict=True):
            place(canvas, digit, y, x)
        boxes = [ink_box(digit, y, x) for (y, x), digit in zip(corners, drawn, strict=True)]
        label = task_label(self.task, [int(self.labels[i]) for i in picks])
        return canvas, label, boxes

    def far_apart(self, drawn: list[np.ndarray], rng: np.random.Generator) -> list[tuple[int, int]]:
        """Top-left corners of two digits in opposite halves (left/right or top/bottom, chosen at random),
        at least half the canvas apart centre to centre, each within JITTER of its half's centre line across
        (free placement over the whole canvas leaves a 16-token ViT at 28% on one digit after 8 epochs)."""
        half, jitter = self.canvas // 2, self.canvas // JITTER
        while True:
            corners = []
            vertical = bool(rng.integers(2))
            for k, digit in enumerate(drawn):
                side = digit.shape[0]
                lo, hi = (0, half - side) if k == 0 else (half, self.canvas - side)
                along = int(rng.integers(lo, hi + 1))
                middle = (self.canvas - side) // 2
                across = int(rng.integers(max(0, middle - jitter), min(self.canvas - side, middle + jitter) + 1))
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
        if key == "length" and kwargs[key] < 1:  # 0 would mean the split's own length, a negative one nothing
            raise UsageError(f"--data {data}: length= is the canvases an epoch draws, at least 1; got {value}")
    if kwargs["task"] not in TASKS:
        raise UsageError(f"--data {data}: the task is one of {', '.join(TASKS)}, got {kwargs['task']!r}")
    return kwargs


def digits_split(data: str, split: str, transform=None) -> DigitCanvases:
    """The split of a `digits:` data spec (length= applies to training only)."""
    kwargs = parse_digits_spec(data)
    if split != "train":
        kwargs.pop("length", None)
    return DigitCanvases(split, transform=transform, **kwargs)


EVAL_SPLITS = ("val", "test", "shifted")


def write_digit_folder(
    out: str | Path,
    task: str = "digit",
    canvas: int = 48,
    clutter: int = 2,
    seed: int = 0,
    splits: tuple[str, ...] = EVAL_SPLITS,
    progress: bool = True,
) -> dict:
    """Write the fixed evaluation splits as an image folder: OUT/<split>/<label>/<index>.png (RGB), OUT/boxes.json
    (the ink boxes of the digits that decide each label) and OUT/meta.json, so every folder command (eval,
    explain, spectral, erf, predict) reads exactly the canvases that `--data digits:...` draws."""
    out = Path(out)
    boxes: dict[str, list[list[int]]] = {}
    counts = {}
    for split in splits:
        data = DigitCanvases(split, task=task, canvas=canvas, clutter=clutter, seed=seed)
        for index in tqdm(range(len(data)), desc=f"digits {split}", unit="img", disable=not progress):
            image, label, item_boxes = data.render(index, item_rng(seed, split, 0, index))
            rel = f"{split}/{label}/{index:05d}.png"
            (out / rel).parent.mkdir(parents=True, exist_ok=True)
            Image.fromarray(image).convert("RGB").save(out / rel)
            boxes[rel] = item_boxes
        counts[split] = len(data)
    (out / "boxes.json").write_text(json.dumps(boxes, indent=0, sort_keys=True))
    meta = dict(
        data=f"{PREFIX}{task},canvas={canvas},clutter={clutter},seed={seed}",
        images=counts,
        drawing={split: asdict(drawing_for(split, clutter)) for split in splits},
        box_format="[xmin, ymin, xmax, ymax], 0-based pixels, max exclusive, tight around the deciding digits' ink",
    )
    (out / "meta.json").write_text(json.dumps(meta, indent=2))
    return meta


@dataclass
class DigitFolderConfig(Config):
    """`linvit data digits`: which task's fixed evaluation canvases, at which canvas and clutter, where."""

    output: str | None = None
    task: str = "digit"
    canvas: int = 48
    clutter: int = 2
    seed: int = 0


def run_digit_folder(config: DigitFolderConfig) -> None:
    """`linvit data digits`: the evaluation splits of one digit task as a folder, and what was written."""
    if not config.output:
        raise UsageError("give --output DIR")
    meta = write_digit_folder(config.output, config.task, config.canvas, config.clutter, config.seed)
    counts = ", ".join(f"{n} {split}" for split, n in meta["images"].items())
    print(f"wrote {counts} canvases of {meta['data']} and boxes.json to {config.output}")
