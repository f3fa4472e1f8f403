"""WebDataset shards (`--data wds:FOLDER`) read as a map-style split: FOLDER/<split>-*.tar, each sample an image
plus its integer ``.cls``.

Why not an iterable reader: indexing the tar members once (offsets only, no image bytes) gives every sample an
index, so the trainer's DistributedSampler shards them by rank, shuffles them per seed and epoch and resumes
mid-epoch exactly as it does for class folders, with the same transforms. A sample is the tar members that share
a key (the member name up to the first dot of its file name), as WebDataset groups them.
"""

from __future__ import annotations

import io
import tarfile
import warnings
from dataclasses import dataclass
from pathlib import Path

from PIL import Image

from ..errors import UsageError
from .folder import DECODE_ERRORS, UnreadableItems, check_unreadable
from .images import upright_rgb

IMAGE_EXTENSIONS = ("jpg", "jpeg", "png", "webp", "bmp", "ppm", "tif", "tiff")
CLASS_NAMES_FILE = "classes.txt"  # optional, one class name per line in label order


@dataclass(frozen=True)
class Member:
    shard: Path
    offset: int
    size: int


def split_key(name: str) -> tuple[str, str]:
    """ "dir/n0144_17.cls" -> ("dir/n0144_17", "cls"): WebDataset's key is the name up to the file name's first dot."""
    folder, _, base = name.rpartition("/")
    stem, _, ext = base.partition(".")
    return (f"{folder}/{stem}" if folder else stem), ext.lower()


def read_member(member: Member) -> bytes:
    with open(member.shard, "rb") as f:
        f.seek(member.offset)
        return f.read(member.size)


def index_shard(shard: Path) -> list[tuple[str, Member, int]]:
    """(key, image member, label) of each sample of one shard, in the shard's order."""
    samples: dict[str, dict[str, Member]] = {}
    labels: dict[str, bytes] = {}  # read from the open tar: a file open per label doubled the indexing time
    try:  # "r:" refuses a compressed tar: the offsets must be the file's own
        with tarfile.open(shard, "r:") as tar:
            for info in tar:
                if info.isfile():
                    key, ext = split_key(info.name)
                    samples.setdefault(key, {})[ext] = Member(shard, info.offset_data, info.size)
                    if ext == "cls":
                        labels[key] = tar.extractfile(info).read()
    except tarfile.ReadError as err:
        raise UsageError(f"{shard}: not an uncompressed tar ({str(err).splitlines()[0]})") from err
    return [(key, image_member(shard, key, parts), label(shard, key, parts, labels)) for key, parts in samples.items()]


def image_member(shard: Path, key: str, parts: dict[str, Member]) -> Member:
    """The sample's image: an image extension, or as WebDataset decodes one, the last part of a longer
    extension ("input.jpg") when just one member has such a part."""
    image = next((parts[ext] for ext in IMAGE_EXTENSIONS if ext in parts), None)
    named = [ext for ext in parts if ext.rpartition(".")[2] in IMAGE_EXTENSIONS]
    if image is None and len(named) == 1:
        image = parts[named[0]]
    if image is None:
        why = "several images" if named else "no image"
        raise UsageError(f"{shard}: sample {key!r} has {why} (members: {', '.join(sorted(parts))})")
    return image


def label(shard: Path, key: str, parts: dict[str, Member], labels: dict[str, bytes]) -> int:
    if key not in labels:
        raise UsageError(f"{shard}: sample {key!r} has no .cls label (members: {', '.join(sorted(parts))})")
    text = labels[key].decode(errors="replace").strip()
    if not (text.isascii() and text.isdigit()):
        raise UsageError(f"{shard}: sample {key!r} has .cls {text[:40]!r}, not a class index")
    return int(text)


class WebDatasetSplit(UnreadableItems):
    """One split of a WebDataset folder; items (image, target, unreadable) as SafeImageFolder's."""

    def __init__(self, folder: str | Path, split: str, transform=None, unreadable: str = "skip") -> None:
        self.unreadable, self.transform = check_unreadable(unreadable), transform
        folder = Path(folder)
        self.root = folder / f"{split}-*.tar"
        shards = sorted(folder.glob(f"{split}-*.tar"))
        if not shards:
            raise UsageError(f"wds:{folder}: no shards match {self.root}")
        self.samples = [(image, label) for shard in shards for _, image, label in index_shard(shard)]
        if not self.samples:
            raise UsageError(f"wds:{folder}: the shards matching {self.root} hold no samples")
        self.targets = [label for _, label in self.samples]
        self.classes = class_names(folder, max(self.targets) + 1)
        self.names_classes = (Path(folder) / CLASS_NAMES_FILE).is_file()  # else the classes are numbers

    def __len__(self) -> int:
        return len(self.samples)

    def decode(self, index: int):
        member = self.samples[index][0]
        try:
            with Image.open(io.BytesIO(read_member(member))) as image:
                return upright_rgb(image)
        except DECODE_ERRORS as err:
            warnings.warn(f"unreadable image at byte {member.offset} of {member.shard}: {err}", stacklevel=2)
            return None

    def target(self, index: int) -> int:
        return self.samples[index][1]


def class_names(folder: Path, labels_seen: int) -> list[str]:
    """FOLDER/classes.txt when it exists (checked against the labels), else the indices as names."""
    path = folder / CLASS_NAMES_FILE
    if not path.is_file():
        return [str(i) for i in range(labels_seen)]
    names = [line.strip() for line in path.read_text().splitlines() if line.strip()]
    if len(names) < labels_seen:
        raise UsageError(f"{path}: {len(names)} class names, but the shards use label {labels_seen - 1}")
    return names
