"""A classifier on your own pictures: ``linvit.load_image``, ``linvit.predict`` and ``linvit predict``.

Images are files, folders (searched recursively) or glob patterns, read by linvit.data.images (upright 8-bit
RGB, a pixel-count guard instead of PIL's decompression-bomb error). Three sizes:
    default   the model's own data config (a run folder's: the size, crop, mean/std it was trained with)
    img_size  resized to exactly H x W, then normalised with the model's mean/std
    native    the image's own size rounded to the patch grid: global inference on the whole picture (token
              chunking keeps memory bounded for Linear- and Katz-InfSA models)
With --maps each picture also gets its importance map drawn over it at its own size (MapWriter).
"""

from __future__ import annotations

import dataclasses
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
from PIL import Image
from timm.data import create_transform, resolve_model_data_config
from torchvision.transforms import functional as TF
from tqdm import tqdm

from ..config import Config
from ..data.images import DEFAULT_MAX_PIXELS, find_images, read_rgb
from ..distributed import resolve_device
from ..errors import UsageError
from ..models import patch_size
from ..onnx_runtime import OnnxClassifier, refuse_pytorch_flags
from ..utils.runtime import autocast, resolve_amp
from .output import OutputPaths, check_out_file, read_or_skip, report_skipped, write_jsonl


def native_size(size: tuple[int, int], patch: tuple[int, int]) -> tuple[int, int]:
    """(H, W) rounded to the nearest multiple of the patch (at least one patch)."""
    return tuple(max(p, int(s / p + 0.5) * p) for s, p in zip(size, patch, strict=True))  # halves round up


def load_image(
    path: str | Path,
    model: nn.Module,
    img_size: int | Sequence[int] | None = None,
    native: bool = False,
    max_pixels: int = DEFAULT_MAX_PIXELS,
) -> torch.Tensor:
    """A (3, H, W) float tensor ready for model: its data config by default, exactly img_size, or native size."""
    return prepare_image(read_rgb(path, max_pixels), model, img_size, native)


def prepare_image(
    image: Image.Image, model: nn.Module, img_size: int | Sequence[int] | None = None, native: bool = False
) -> torch.Tensor:
    """An RGB picture as model input (see load_image); normalised in place, so an 8K picture costs one float copy."""
    config = resolve_model_data_config(model)
    if img_size is None and not native:
        return create_transform(**config, is_training=False)(image)
    if native and img_size is not None:
        raise UsageError("give either img_size or native, not both")
    if native:
        size = native_size((image.height, image.width), patch_size(model))
    else:
        size = (img_size, img_size) if isinstance(img_size, int) else tuple(img_size)
        if len(size) != 2:
            raise UsageError(f"img_size takes one side or (H, W), got {img_size}")
    tensor = TF.pil_to_tensor(image)
    if tuple(size) != (image.height, image.width):  # resized as uint8, like timm's PIL transforms
        tensor = TF.resize(tensor, list(size), interpolation=TF.InterpolationMode.BICUBIC, antialias=True)
    mean = torch.tensor(config["mean"]).reshape(3, 1, 1) * 255
    std = torch.tensor(config["std"]).reshape(3, 1, 1) * 255
    return tensor.float().sub_(mean).div_(std)


@torch.no_grad()
def predict(
    model: nn.Module,
    images: Sequence[torch.Tensor],
    topk: int = 5,
    label_names: Sequence[str] | None = None,
    batch_size: int = 8,
    device: torch.device | str = "cpu",
    amp: str = "none",
) -> list[dict]:
    """Top-k (label, probability) per image; images of equal size run together in batches of batch_size; amp
    "auto": bf16 autocast where the CPU multiplies bf16 in hardware (utils.runtime.resolve_amp)."""
    device = torch.device(device)
    amp = resolve_amp(device, amp)
    model.eval().to(device)
    names = list(label_names or getattr(model, "label_names", None) or [])
    results: list[dict | None] = [None] * len(images)
    for indices in _equal_size_batches(images, batch_size):
        batch = images[indices[0]][None] if len(indices) == 1 else torch.stack([images[i] for i in indices])
        batch = batch.to(device)  # one image is a view, not a copy: at 8K the copy alone is 805 MB
        with autocast(device, amp):
            out = model(batch)  # a Hugging Face classifier (a distilled student of one) returns a ModelOutput
            probs = (out if isinstance(out, torch.Tensor) else out.logits).float().softmax(-1)
        values, classes = probs.topk(min(topk, probs.shape[-1]), dim=-1)
        for i, v, c in zip(indices, values.cpu().tolist(), classes.cpu().tolist(), strict=True):
            labels = [names[k] if k < len(names) else str(k) for k in c]
            topk_rows = [{"label": lab, "class": k, "prob": p} for lab, k, p in zip(labels, c, v, strict=True)]
            results[i] = {"topk": topk_rows}
    return results  # type: ignore[return-value]


def _equal_size_batches(images: Sequence[torch.Tensor], batch_size: int) -> list[list[int]]:
    groups: dict[tuple, list[int]] = {}
    for i, image in enumerate(images):
        groups.setdefault(tuple(image.shape), []).append(i)
    return [idx[s : s + batch_size] for idx in groups.values() for s in range(0, len(idx), batch_size)]


@dataclasses.dataclass
class PredictConfig(Config):
    """`linvit predict`: which model, which pictures at which size, what to write."""

    images: list[str] = dataclasses.field(default_factory=list)
    model: str | None = None  # without it, checkpoint is a run folder
    model_kwargs: dict = dataclasses.field(default_factory=dict)
    pretrained: bool = False  # the CLI folds it into model_kwargs
    checkpoint: str | None = None
    img_size: list[int] | None = None  # resize to H [W]; None: the model's data config
    native: bool = False
    max_pixels: int | None = None  # None: DEFAULT_MAX_PIXELS
    topk: int = 5
    output: str | None = None  # preds.jsonl
    batch_size: int = 8
    maps: str | None = None
    method: str | None = None
    amp: str = "auto"  # bf16 on a CPU with native bf16 products (measured: docs/benchmarks.md), else float32
    device: str = "auto"
    compile: str = "off"
    progress: bool = True


def load_model(config: PredictConfig) -> nn.Module:
    """checkpoint RUN (a run folder) or model NAME [checkpoint WEIGHTS]."""
    from ..runs import load_run
    from ..weights import create_for_checkpoint, load_weights, refuse_exported_graph

    if str(config.checkpoint or "").lower().endswith(".onnx"):
        return exported_classifier(config)
    refuse_exported_graph(config.checkpoint)
    if config.model is None:
        if not config.checkpoint:
            raise UsageError("give --checkpoint RUN (a run folder) or --model NAME")
        return load_run(config.checkpoint)
    torch.manual_seed(0)  # random weights (no --checkpoint) are the same on every run
    model = create_for_checkpoint(config.model, config.checkpoint, any_size=True, **config.model_kwargs)
    if config.checkpoint:
        load_weights(model, config.checkpoint)
    return model


def exported_classifier(config: PredictConfig) -> nn.Module:
    """An .onnx file of `linvit export` in onnxruntime (CPU), with the preprocessing and class names stored in
    it; flags that change how PyTorch runs a model, and what needs the PyTorch model (maps, native sizes), are
    refused in one line."""
    refuse_pytorch_flags(config, **{"--native": config.native, "--maps": config.maps is not None})
    model = OnnxClassifier(config.checkpoint)
    if config.img_size is not None:
        model.data_config(config.img_size)  # a size the graph does not take is one line here, not an onnx error
    return model


def run_predict(config: PredictConfig) -> list[dict]:
    """`linvit predict`: top-k per image to stdout, with --output one JSON line per image, with --maps overlays.
    Unreadable pictures are reported, counted and skipped (as explain and evaluation do); none readable is an
    error. An image's "seconds" are its own reading and resizing, its share of its batch's forward and its map."""
    from ..utils.compile import compile_model
    from ..weights import height_width

    if config.method is not None and not config.maps:  # it would be ignored: no map is written without --maps
        raise UsageError(f"--method {config.method} chooses how --maps are computed: add --maps DIR")
    paths = find_images(config.images)
    model = load_model(config)
    device = torch.device("cpu") if isinstance(model, OnnxClassifier) else resolve_device(config.device)
    max_pixels = config.max_pixels or DEFAULT_MAX_PIXELS
    img_size = height_width(config.img_size)
    check_out_file(config.output, "preds.jsonl")
    cropped = img_size is None and not config.native  # the model's data config: resize and centre crop
    maps = MapWriter(model, config.maps, config.method, paths, crop=cropped) if config.maps else None
    runner = compile_model(model.eval().to(device), config.compile)
    names = getattr(model, "label_names", None)
    amp = "none" if isinstance(model, OnnxClassifier) else resolve_amp(device, config.amp)
    if config.amp == "auto" and amp != "none":
        print(
            f"{amp} autocast (--amp auto, the default: this CPU multiplies {amp} in hardware; --amp none for float32)",
            file=sys.stderr,
        )
    records, batch = [], config.batch_size
    bar = tqdm(total=len(paths), desc="predict", unit="image", disable=not config.progress)  # as --help says
    for start in range(0, len(paths), batch):
        chunk = paths[start : start + batch]
        kept, pictures, tensors, seconds = read_pictures(chunk, model, img_size, config.native, max_pixels)
        if not kept:
            bar.update(len(chunk))
            continue
        if maps is None:  # the pictures are needed again only to draw maps on; at 8K each is 200 MB
            pictures = [None] * len(kept)
        tick = time.perf_counter()
        outputs = predict(runner, tensors, config.topk, names, batch, device, amp)
        share = (time.perf_counter() - tick) / len(kept)
        for path, picture, tensor, out, own in zip(kept, pictures, tensors, outputs, seconds, strict=True):
            record = {"path": str(path), "size": list(tensor.shape[-2:]), **out, "amp": amp}
            tick = time.perf_counter()
            if maps is not None:
                record.update(maps.write(path, picture, tensor.to(device)))
            record["seconds"] = round(own + share + time.perf_counter() - tick, 4)
            records.append(record)
            top = out["topk"][0]
            tqdm.write(f"{path}: {top['label']} ({top['prob']:.3f})" + _rest(out["topk"][1:]))  # above the bar
        bar.update(len(chunk))
    bar.close()
    report_skipped(len(paths) - len(records), len(paths))
    if config.output:
        write_jsonl(config.output, records)
    return records


def read_pictures(chunk: Sequence[Path], model: nn.Module, img_size, native: bool, max_pixels: int):
    """The readable pictures of chunk as (paths, pictures, model inputs, seconds each took to read and prepare);
    an unreadable one is reported on stderr and left out."""
    kept, pictures, tensors, seconds = [], [], [], []
    for path in chunk:
        tick = time.perf_counter()
        if (picture := read_or_skip(path, max_pixels)) is None:
            continue
        tensors.append(prepare_image(picture, model, img_size, native))
        kept.append(path)
        pictures.append(picture)
        seconds.append(time.perf_counter() - tick)
    return kept, pictures, tensors, seconds


class MapWriter:
    """Per image: the model's importance map as DIR/<name>.png (over the original picture, at its size) and the
    raw patch-grid map as DIR/<name>.npy; names mirror the images' paths below their common folder (OutputPaths)."""

    def __init__(self, model: nn.Module, folder: str | Path, method: str | None, paths: Sequence[Path], crop: bool):
        from ..explain.maps import METHODS

        if method is not None and method not in METHODS:
            raise UsageError(f"--method {method!r}: choose from {', '.join(METHODS)}")
        self.model, self.method, self.folder = model, method, Path(folder)
        self.config = resolve_model_data_config(model) if crop else None
        self.targets = OutputPaths(paths, self.folder, ".png")

    def write(self, path: Path, picture: Image.Image, tensor: torch.Tensor) -> dict:
        from ..explain.maps import importance_maps
        from ..explain.overlay import overlay, seen_box

        maps = importance_maps(self.model, tensor[None], self.method, upsample=False)
        patch_map = maps.patch[0].cpu().numpy()
        target = self.targets(path)
        np.save(target.with_suffix(".npy"), patch_map)
        overlay(picture, patch_map, seen_box(picture.size, self.config)).save(target)
        return {"map": str(target), "map_method": maps.method}


def _rest(others: list[dict]) -> str:
    return "".join(f", {o['label']} ({o['prob']:.3f})" for o in others)
