"""Atomic writes: a temp file in the same folder, then a rename, so a kill never leaves a torn file."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import torch


def _write_then_rename(path: Path, tmp: Path, write: Callable[[Path], None]) -> None:
    """write(tmp), then rename it over path; if write fails, path keeps what it held and tmp is removed."""
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def atomic_save(obj, path: Path) -> None:
    """torch.save to PATH.tmp in the same folder, then rename: a kill never leaves a torn file."""
    _write_then_rename(path, path.with_name(path.name + ".tmp"), lambda tmp: torch.save(obj, tmp))


def atomic_write_text(text: str, path: Path) -> None:
    """Text to PATH.tmp, then rename."""
    _write_then_rename(path, path.with_name(path.name + ".tmp"), lambda tmp: tmp.write_text(text))


def atomic_write(path: Path, write: Callable[[Path], None]) -> None:
    """write(tmp) to a temp file beside path with the same suffix (so writers that pick the format by suffix,
    PIL and numpy, still do), then rename; if write fails, path keeps what it held and the temp file goes."""
    _write_then_rename(path, path.with_name(f"{path.stem}.tmp{path.suffix}"), write)
