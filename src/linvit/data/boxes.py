"""Ground-truth boxes: linvit's boxes.json and Pascal-VOC XML folders (ImageNet's validation format).

Both give {image key: [[xmin, ymin, xmax, ymax], ...]} in 0-based pixels with max exclusive; VOC's
1-based inclusive corners are converted (xmin - 1, xmax).
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

from ..errors import UsageError

Boxes = dict[str, list[list[float]]]


def read_voc_xml(path: str | Path) -> tuple[str, list[list[float]]]:
    """(image file name, boxes) from one Pascal-VOC annotation file."""
    try:
        root = ET.parse(path).getroot()
    except ET.ParseError as err:
        raise UsageError(f"{path}: not a valid VOC XML file ({err})") from err
    name = (root.findtext("filename") or Path(path).stem).strip()
    boxes = []
    for obj in root.iter("object"):
        bb = obj.find("bndbox")
        if bb is None:
            continue
        xmin, ymin, xmax, ymax = (float(bb.findtext(t)) for t in ("xmin", "ymin", "xmax", "ymax"))
        boxes.append([xmin - 1, ymin - 1, xmax, ymax])
    return name, boxes


def load_boxes(source: str | Path) -> Boxes:
    """Boxes from a boxes.json file or from a folder of VOC XML files (keyed by their <filename>)."""
    source = Path(source)
    if source.is_dir():
        files = sorted(source.rglob("*.xml"))
        if not files:
            raise UsageError(f"{source}: no .xml annotation files found")
        return dict(read_voc_xml(f) for f in files)
    if not source.is_file():
        raise UsageError(f"{source}: no such boxes file or folder")
    try:
        raw = json.loads(source.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise UsageError(f"{source}: not a JSON file ({err})") from err
    if not isinstance(raw, dict):
        raise UsageError(f"{source}: expected an object {{image: [[xmin, ymin, xmax, ymax], ...]}}")
    boxes = {}
    for key, value in raw.items():
        try:
            boxes[key] = [[float(c) for c in box] for box in value]
        except (TypeError, ValueError) as err:
            raise UsageError(f"{source}: entry {key!r} is not a list of [xmin, ymin, xmax, ymax]: {value!r}") from err
        if any(len(box) != 4 for box in boxes[key]):
            raise UsageError(f"{source}: entry {key!r} has a box without 4 corners: {value!r}")
    return boxes


def boxes_for(image: str | Path, boxes: Boxes, root: str | Path | None = None) -> list[list[float]] | None:
    """Boxes of one image: by its path relative to root, else by file name, else by stem (ImageNet XML)."""
    image = Path(image)
    keys = []
    if root is not None:
        try:
            keys.append(image.resolve().relative_to(Path(root).resolve()).as_posix())
        except ValueError:
            pass
    keys += [image.name, image.stem]
    for key in keys:
        if key in boxes:
            return boxes[key]
    return None
