"""Output folders: created on demand, with a one-line error when the path cannot be a folder; JSON records."""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import UsageError


def output_dir(path: str | Path) -> Path:
    """Create (parents included) and return the folder ``path``; ValueError if a file is in the way."""
    path = Path(path)
    for part in (path, *path.parents):
        if part.exists() and not part.is_dir():
            raise UsageError(f"{part} is a file, not a folder: choose another output path")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UsageError(f"cannot create the output folder {path}: {err.strerror or err}") from err
    return path


def write_json(path: str | Path, record: dict) -> None:
    """record as indented JSON at path, its folder created first."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(record, indent=2))
