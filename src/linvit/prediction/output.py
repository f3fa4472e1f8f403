"""What every prediction command reads and writes: pictures read or skipped alike (read_or_skip, report_skipped),
JSON lines, and one output file per picture named after the picture's path below the pictures' common folder
(OutputPaths), so `linvit predict`, `detect predict` and `segment predict` behave alike."""

from __future__ import annotations

import json
import os
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from PIL import Image
from tqdm import tqdm

from ..data.images import DEFAULT_MAX_PIXELS, read_rgb
from ..errors import UsageError


def read_or_skip(path: Path, max_pixels: int | None) -> Image.Image | None:
    """The picture, or None after a line on stderr where it cannot be read (report_skipped counts them)."""
    try:
        return read_rgb(path, max_pixels or DEFAULT_MAX_PIXELS)
    except UsageError as err:
        tqdm.write(f"skipped {err}", file=sys.stderr)
        return None


def report_skipped(skipped: int, total: int) -> None:
    """One line counting the pictures left out; an error when none could be read."""
    if skipped == total:
        raise UsageError(f"none of the {total} pictures could be read")
    if skipped:
        print(f"skipped {skipped} of {total} pictures (unreadable, see above)", file=sys.stderr)


def check_out_file(out: str | None, example: str) -> None:
    """--output names a file to write, not a folder."""
    if out and Path(out).is_dir():
        raise UsageError(f"--output {out} is a folder; give the file to write, e.g. {Path(out) / example}")


def write_jsonl(path: str | Path, records: Sequence[dict]) -> None:
    """One JSON line per record (the file's folder is made)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def common_folder(paths: Sequence[Path]) -> Path:
    """The deepest folder holding every image (outputs mirror the images' paths below it)."""
    return Path(os.path.commonpath([p.resolve().parent for p in paths])) if paths else Path(".")


class OutputPaths:
    """folder/<each picture's path below the pictures' common folder, suffix replaced>: a.jpg and sub/a.jpg do
    not collide. Pictures that would share a file (flower.jpg and flower.png) keep their whole name
    (flower.jpg.png, flower.png.png); the common case stays flower.png. Compared case-blind, for file systems
    that are."""

    def __init__(self, paths: Sequence[Path], folder: str | Path, suffix: str) -> None:
        root, self.folder = common_folder(paths), Path(folder)
        relative = [Path(p).resolve().relative_to(root) for p in paths]
        short = [r.with_suffix(suffix) for r in relative]
        shared = Counter(_folded(n) for n in short)
        named = [
            n if shared[_folded(n)] == 1 else r.with_name(r.name + suffix) for r, n in zip(relative, short, strict=True)
        ]
        self.names = {Path(p).resolve(): n for p, n in zip(paths, named, strict=True)}
        taken = Counter(_folded(n) for n in named)
        clashes = [str(n) for n in named if taken[_folded(n)] > 1]
        if clashes:  # flower.jpg.png next to flower.jpg and flower.png: nothing readable is left to choose
            raise UsageError(f"two pictures would both write {clashes[0]}; rename one of them")

    def __call__(self, path: Path) -> Path:
        """The output file of picture path, its folder made."""
        target = self.folder / self.names[Path(path).resolve()]
        target.parent.mkdir(parents=True, exist_ok=True)
        return target


def _folded(path: Path) -> str:
    return str(path).casefold()
