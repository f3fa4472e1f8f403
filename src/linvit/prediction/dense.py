"""`linvit detect predict` and `linvit segment predict`: a finished detection or segmentation run on your own
pictures (files, folders, globs; read as ``linvit predict`` reads them), drawn at each picture's own size.

The per-picture work and its drawing are detect.py's and segment.py's beside it; this module holds the two
commands: load the run, walk the pictures with a progress bar, print, write JSON lines (output.py).
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

from torchvision.models.detection import RetinaNet
from torchvision.models.detection.generalized_rcnn import GeneralizedRCNN
from tqdm import tqdm

from ..config import Config
from ..data.images import find_images
from ..distributed import resolve_device
from ..errors import UsageError
from ..runs import load_run
from ..segment.model import Segmenter
from ..weights import read_run_config
from .detect import as_record, detect, draw
from .output import OutputPaths, check_out_file, read_or_skip, report_skipped, write_jsonl
from .segment import class_shares, colour_overlay, save_class_map, segment


@dataclasses.dataclass
class DensePredictConfig(Config):
    """What `detect predict` and `segment predict` share: a finished run, the pictures, what to write."""

    images: list[str] = dataclasses.field(default_factory=list)
    checkpoint: str | None = None  # the run folder
    output: str | None = None  # a .jsonl file
    draw: str | None = None  # a folder of drawn pictures
    max_pixels: int | None = None  # None: DEFAULT_MAX_PIXELS
    amp: str = "none"
    device: str = "auto"
    progress: bool = True


@dataclasses.dataclass
class DetectPredictConfig(DensePredictConfig):
    """`linvit detect predict`: the detections scoring at least score_thresh."""

    score_thresh: float = 0.5


@dataclasses.dataclass
class SegmentPredictConfig(DensePredictConfig):
    """`linvit segment predict`: img_size is the shorter side pictures are resized to (--resize)."""

    img_size: int | None = None  # None: the run's own


def _load(config: DensePredictConfig, kinds: tuple, command: str):
    if not config.checkpoint:
        raise UsageError("give --checkpoint RUN (the run folder of a finished training run)")
    model = load_run(config.checkpoint)
    if not isinstance(model, kinds):
        raise UsageError(f"{config.checkpoint}: not a `linvit {command}` run")
    return model


def run_detect_predict(config: DetectPredictConfig) -> list[dict]:
    """Detections per picture to stdout, --output dets.jsonl, --draw DIR/<name>.png."""
    if not 0 <= config.score_thresh <= 1:
        raise UsageError(f"--score-thresh must be in [0, 1], got {config.score_thresh}")
    check_out_file(config.output, "dets.jsonl")
    paths = find_images(config.images)
    model = _load(config, (GeneralizedRCNN, RetinaNet), "detect train")
    device = resolve_device(config.device)
    model.to(device)
    names = getattr(model, "label_names", None)
    drawn = OutputPaths(paths, config.draw, ".png") if config.draw else None
    records = []
    for path in tqdm(paths, desc="detect", unit="image", disable=not config.progress):
        tick = time.perf_counter()
        if (picture := read_or_skip(path, config.max_pixels)) is None:
            continue
        found = detect(model, picture, device, config.amp, config.score_thresh)
        record = {"path": str(path), "size": [picture.height, picture.width], "detections": as_record(found, names)}
        record["seconds"] = round(time.perf_counter() - tick, 4)
        if config.draw:
            target = drawn(path)
            draw(picture, found, names).save(target)
            record["drawn"] = str(target)
        records.append(record)
        summary = ", ".join(f"{d['label']} {d['score']:.2f}" for d in record["detections"][:5]) or "nothing"
        tqdm.write(f"{path}: {len(record['detections'])} detections ({summary})")  # above the progress bar
    report_skipped(len(paths) - len(records), len(paths))
    if config.output:
        write_jsonl(config.output, records)
    return records


def run_img_size(run: str | Path) -> int | None:
    """The shorter side the run evaluated at (its --resize), None when it kept each image's size."""
    found = read_run_config(run)
    return found[1]["linvit"].get("args", {}).get("img_size") if found else None


def run_segment_predict(config: SegmentPredictConfig) -> list[dict]:
    """Class shares per picture to stdout, --output segs.jsonl, --draw DIR/<name>.png and DIR/<name>_classes.png."""
    check_out_file(config.output, "segs.jsonl")
    paths = find_images(config.images)
    model = _load(config, (Segmenter,), "segment train")
    img_size = config.img_size or run_img_size(config.checkpoint)
    device = resolve_device(config.device)
    model.to(device)
    names, records = getattr(model, "label_names", None), []
    drawn = OutputPaths(paths, config.draw, ".png") if config.draw else None
    for path in tqdm(paths, desc="segment", unit="image", disable=not config.progress):
        tick = time.perf_counter()
        if (picture := read_or_skip(path, config.max_pixels)) is None:
            continue
        classes = segment(model, picture, device, img_size, config.amp)
        shares = class_shares(classes, names)
        record = {"path": str(path), "size": [picture.height, picture.width], "classes": shares}
        record["seconds"] = round(time.perf_counter() - tick, 4)
        if config.draw:
            target = drawn(path)
            colour_overlay(picture, classes, model.num_classes).save(target)
            save_class_map(classes, target.with_name(target.stem + "_classes.png"), model.num_classes)
            record["drawn"] = str(target)
        records.append(record)
        tqdm.write(f"{path}: " + ", ".join(f"{k} {v:.0%}" for k, v in list(shares.items())[:5]))
    report_skipped(len(paths) - len(records), len(paths))
    if config.output:
        write_jsonl(config.output, records)
    return records
