"""A Hugging Face ``DatasetDict`` saved with ``save_to_disk`` (`--data hfds:FOLDER`), read through ``datasets``.

Splits ``train`` and ``validation`` (linvit's ``val`` reads ``validation`` when the folder has no ``val``),
columns ``image`` (an Image feature, decoded to PIL by ``datasets``) and ``label`` (its ClassLabel names become the
class names). The table is memory-mapped Arrow: map-style, so rank shards, seeded shuffles and mid-epoch resume are
the trainer's, as for class folders.
"""

from __future__ import annotations

import warnings
from pathlib import Path

from ..errors import UsageError
from .folder import DECODE_ERRORS, UnreadableItems, check_unreadable
from .images import upright_rgb

SPLIT_ALIASES = {"val": "validation"}


def load_saved_split(folder: Path, split: str):
    """The split of a save_to_disk folder, with one-line errors for what is not one."""
    if not folder.is_dir():
        raise UsageError(f"hfds:{folder}: no such folder")
    try:
        import datasets
    except ImportError as err:
        raise UsageError("--data hfds: needs the datasets package: pip install datasets") from err
    try:
        saved = datasets.load_from_disk(str(folder))
    except FileNotFoundError as err:
        raise UsageError(f"hfds:{folder}: not a folder written by DatasetDict.save_to_disk ({err})") from err
    except IndexError as err:  # datasets saves an empty split without a table, then fails to load it
        raise UsageError(f"hfds:{folder}: a split with no rows cannot be loaded ({err})") from err
    if not isinstance(saved, datasets.DatasetDict):
        raise UsageError(f"hfds:{folder}: a single Dataset; save a DatasetDict with splits 'train' and 'validation'")
    name = split if split in saved or split not in SPLIT_ALIASES else SPLIT_ALIASES[split]
    if name not in saved:
        raise UsageError(f"hfds:{folder}: no split {split!r} (it has {', '.join(saved)})")
    table = saved[name]
    missing = [column for column in ("image", "label") if column not in table.column_names]
    if missing:
        raise UsageError(
            f"hfds:{folder}/{name}: no {' or '.join(missing)} column (columns: {', '.join(table.column_names)})"
        )
    return decoded_images(folder / name, table)


def decoded_images(where: Path, table):
    """The table with its image column decoded to PIL by ``datasets``: a column of file paths or of
    {"bytes", "path"} (``Image(decode=False)``, or never cast to Image) is cast to ``datasets.Image()``."""
    import datasets

    feature = table.features["image"]
    if isinstance(feature, datasets.Image) and feature.decode:
        return table
    try:
        return table.cast_column("image", datasets.Image())
    except (TypeError, ValueError, NotImplementedError) as err:  # pyarrow's cast errors
        raise UsageError(f"hfds:{where}: the image column ({feature}) is not images, paths or bytes") from err


def checked_labels(where: Path, table) -> list[int]:
    """The label column as class indices; string labels and -1 (an unlabelled test split) are refused."""
    labels = list(table["label"])
    if not labels:
        raise UsageError(f"hfds:{where}: an empty split")
    if not all(isinstance(label, int) and label >= 0 for label in labels):
        bad = next(label for label in labels if not (isinstance(label, int) and label >= 0))
        raise UsageError(
            f"hfds:{where}: label {bad!r} is not a class index (cast the column to a ClassLabel; "
            "-1 marks an unlabelled split)"
        )
    return labels


class HFSavedSplit(UnreadableItems):
    """One split of a saved DatasetDict; items (image, target, unreadable) as SafeImageFolder's."""

    def __init__(self, folder: str | Path, split: str, transform=None, unreadable: str = "skip") -> None:
        self.unreadable, self.transform = check_unreadable(unreadable), transform
        self.root = Path(folder) / split
        self.table = load_saved_split(Path(folder), split)
        self.targets = checked_labels(self.root, self.table)
        names = getattr(self.table.features["label"], "names", None)
        self.classes = list(names) if names else [str(i) for i in range(max(self.targets) + 1)]
        self.names_classes = bool(names)  # else the classes are numbers

    def __len__(self) -> int:
        return len(self.table)

    def decode(self, index: int):
        try:
            return upright_rgb(self.table[index]["image"])
        except DECODE_ERRORS as err:
            warnings.warn(f"unreadable image at row {index} of {self.root}: {err}", stacklevel=2)
            return None

    def target(self, index: int) -> int:
        return self.targets[index]
