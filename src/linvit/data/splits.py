"""`--data` specs, one reader per spelling: a class folder (DATA/SPLIT/CLASS/IMAGE), the drawn digits
(`digits:TASK,...`), WebDataset shards (`wds:FOLDER`) and a saved Hugging Face DatasetDict (`hfds:FOLDER`).

Every reader is map-style with items (image, target, unreadable) and a ``classes`` list, so every command that
reads data takes every spelling, and rank sharding, shuffling and resume stay the trainer's.
"""

from __future__ import annotations

import re
from pathlib import Path

from ..errors import UsageError
from .digit_tasks import digits_split, is_digits_spec
from .folder import SafeImageFolder

READER_PREFIXES = ("digits:", "wds:", "hfds:")
_PREFIX = re.compile(r"^([A-Za-z][A-Za-z0-9_]+):(?!//)")


def is_reader_spec(data) -> bool:
    """Whether --data names a reader (digits:, wds:, hfds:) rather than a folder of image files."""
    return str(data).startswith(READER_PREFIXES)


def open_split(data, split: str, transform=None, unreadable: str = "skip"):
    """The split of a `--data` spec as a dataset of (image, target, unreadable) items."""
    if is_digits_spec(data):
        return digits_split(data, split, transform)
    text = str(data)
    if text.startswith("wds:"):
        from .webdataset_shards import WebDatasetSplit

        return WebDatasetSplit(text[len("wds:") :], split, transform, unreadable)
    if text.startswith("hfds:"):
        from .hf_saved import HFSavedSplit

        return HFSavedSplit(text[len("hfds:") :], split, transform, unreadable)
    prefix = _PREFIX.match(text)
    if prefix and not Path(text).exists():
        raise UsageError(
            f"--data {text}: unknown reader {prefix.group(1)!r}; linvit reads class folders and "
            f"{', '.join(p + '...' for p in READER_PREFIXES)}"
        )
    return SafeImageFolder(Path(text) / split, transform=transform, unreadable=unreadable)
