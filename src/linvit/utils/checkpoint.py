"""Atomic writes: a temp file in the same folder, then a rename, so a kill never leaves a torn file."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import torch


def atomic_save(obj, path: Path) -> None:
    """torch.save to a temp file in the same folder, then rename: a kill never leaves a torn file."""
    tmp = path.with_name(path.name + ".tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def atomic_write_text(text: str, path: Path) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def atomic_write(path: Path, write: Callable[[Path], None]) -> None:
    """write(tmp) to a temp file beside path with the same suffix (so writers that pick the format by suffix,
    PIL and numpy, still do), then rename; if write fails, path keeps what it held and the temp file goes."""
    tmp = path.with_name(f"{path.stem}.tmp{path.suffix}")
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
