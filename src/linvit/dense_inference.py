"""`linvit detect predict` and `linvit segment predict`: a finished detection or segmentation run on your own
pictures (files, folders, globs; read as ``linvit predict`` reads them), drawn at each picture's own size.

The drawing and per-picture work lives with each task (linvit.detect.predict, linvit.segment.predict); this
module holds the commands: load the run, walk the pictures with a progress bar, print, write JSON lines.
"""

from __future__ import annotations

import time
from pathlib import Path

from torchvision.models.detection import RetinaNet
from torchvision.models.detection.generalized_rcnn import GeneralizedRCNN
from tqdm import tqdm

from .data.images import DEFAULT_MAX_PIXELS, find_images, read_rgb
from .detect.predict import as_record, detect, draw
from .distributed import resolve_device
from .errors import UsageError
from .inference import OutputPaths, check_out_file, write_jsonl
from .runs import load_run
from .segment.model import Segmenter
from .segment.predict import class_shares, colour_overlay, save_class_map, segment
from .utils.artifacts import read_run_config


def run_detect_predict(args) -> list[dict]:
    """Detections per picture to stdout, --out dets.jsonl, --draw DIR/<name>.png."""
    if not 0 <= args.score_thresh <= 1:
        raise UsageError(f"--score-thresh must be in [0, 1], got {args.score_thresh}")
    check_out_file(args.out, "dets.jsonl")
    paths = find_images(args.images)
    model = load_run(args.checkpoint)
    if not isinstance(model, (GeneralizedRCNN, RetinaNet)):
        raise UsageError(f"{args.checkpoint}: not a `linvit detect train` run")
    device = resolve_device(args.device)
    model.to(device)
    names = getattr(model, "label_names", None)
    drawn = OutputPaths(paths, args.draw, ".png") if args.draw else None
    records = []
    for path in tqdm(paths, desc="detect", unit="image", disable=not args.progress):
        tick = time.perf_counter()
        picture = read_rgb(path, args.max_pixels or DEFAULT_MAX_PIXELS)
        found = detect(model, picture, device, args.amp, args.score_thresh)
        record = {"path": str(path), "size": [picture.height, picture.width], "detections": as_record(found, names)}
        record["seconds"] = round(time.perf_counter() - tick, 4)
        if args.draw:
            target = drawn(path)
            draw(picture, found, names).save(target)
            record["drawn"] = str(target)
        records.append(record)
        summary = ", ".join(f"{d['label']} {d['score']:.2f}" for d in record["detections"][:5]) or "nothing"
        print(f"{path}: {len(record['detections'])} detections ({summary})")
    if args.out:
        write_jsonl(args.out, records)
    return records


def run_img_size(run: str | Path) -> int | None:
    """The shorter side the run evaluated at (its --img-size), None when it kept each image's size."""
    found = read_run_config(run)
    return found[1]["linvit"].get("args", {}).get("img_size") if found else None


def run_segment_predict(args) -> list[dict]:
    """Class shares per picture to stdout, --out segs.jsonl, --draw DIR/<name>.png and DIR/<name>_classes.png."""
    check_out_file(args.out, "segs.jsonl")
    paths = find_images(args.images)
    model = load_run(args.checkpoint)
    if not isinstance(model, Segmenter):
        raise UsageError(f"{args.checkpoint}: not a `linvit segment train` run")
    img_size = args.img_size or run_img_size(args.checkpoint)
    device = resolve_device(args.device)
    model.to(device)
    names, records = getattr(model, "label_names", None), []
    drawn = OutputPaths(paths, args.draw, ".png") if args.draw else None
    for path in tqdm(paths, desc="segment", unit="image", disable=not args.progress):
        tick = time.perf_counter()
        picture = read_rgb(path, args.max_pixels or DEFAULT_MAX_PIXELS)
        classes = segment(model, picture, device, img_size, args.amp)
        shares = class_shares(classes, names)
        record = {"path": str(path), "size": [picture.height, picture.width], "classes": shares}
        record["seconds"] = round(time.perf_counter() - tick, 4)
        if args.draw:
            target = drawn(path)
            colour_overlay(picture, classes, model.num_classes).save(target)
            save_class_map(classes, target.with_name(target.stem + "_classes.png"), model.num_classes)
            record["drawn"] = str(target)
        records.append(record)
        print(f"{path}: " + ", ".join(f"{k} {v:.0%}" for k, v in list(shares.items())[:5]))
    if args.out:
        write_jsonl(args.out, records)
    return records
