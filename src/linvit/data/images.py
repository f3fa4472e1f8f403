"""Pictures from disk as a person means them: files, folders and globs found; each read upright, 8-bit RGB.

EXIF orientation is applied; greyscale, palette, RGBA (composited on white), 16-bit and float images become
8-bit RGB; a pixel-count guard fails with one line instead of PIL's decompression-bomb error.
"""

from __future__ import annotations

import contextlib
import glob
import warnings
from collections.abc import Iterable
from pathlib import Path

import numpy as np
from PIL import Image, ImageOps

from ..errors import UsageError

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".tif", ".tiff", ".webp", ".bmp")
ORIENTATION = 0x0112  # EXIF's orientation tag
DEFAULT_MAX_PIXELS = 2**28  # 268 megapixels (16384 x 16384); read_rgb's own guard, in place of PIL's


def find_images(specs: Iterable[str | Path]) -> list[Path]:
    """Image files named by files, folders (recursive) and glob patterns, sorted within each, duplicates dropped."""
    found: list[Path] = []
    for spec in specs:
        path = Path(spec)
        if path.is_dir():
            matches = sorted(p for p in path.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file())
        elif path.is_file():
            matches = [path]
        else:
            matches = sorted(Path(p) for p in glob.glob(str(spec), recursive=True) if Path(p).is_file())
        if not matches and path.is_dir():
            raise UsageError(f"{spec}: a folder with no image files in it ({', '.join(IMAGE_SUFFIXES)})")
        if not matches:
            raise UsageError(f"{spec}: no such image file, folder or matching pattern")
        found.extend(m for m in matches if m not in found)
    return found


def read_rgb(path: str | Path, max_pixels: int = DEFAULT_MAX_PIXELS) -> Image.Image:
    """The picture at path as 8-bit RGB, upright (EXIF), 16-bit scaled down, transparency over white."""
    path = Path(path)
    pil_guard = Image.MAX_IMAGE_PIXELS
    Image.MAX_IMAGE_PIXELS = None  # the check below replaces PIL's, which would refuse 179 MP whatever max_pixels says
    try:
        with unreadable_as_usage_error(path), Image.open(path) as image:
            if image.width * image.height > max_pixels:
                raise UsageError(
                    f"{path}: {image.width} x {image.height} is {image.width * image.height:,} pixels, above "
                    f"--max-pixels {max_pixels:,}; raise it if you mean to read this image"
                )
            return upright_rgb(image)
    finally:
        Image.MAX_IMAGE_PIXELS = pil_guard


def load_rgb(path: str | Path) -> Image.Image:
    """The picture at path as read_rgb reads it, with PIL's own checks and errors (what a dataset's decode
    catches): the training and evaluation folders read each file as predict and explain do."""
    with Image.open(path) as image:
        return upright_rgb(image)


def load_rgb_and_stored_size(path: str | Path) -> tuple[Image.Image, tuple[int, int]]:
    """load_rgb's picture and the (width, height) its file stores before EXIF orientation: where annotations
    (boxes, label maps) disagree with the upright size, the stored one says whether they were made on it. A file
    that is not a picture is a one-line error naming it."""
    with unreadable_as_usage_error(path), Image.open(path) as image:
        if (tag := orientation(image)) != 1:
            _note_turned(path, tag)
        return upright_rgb(image), image.size


_turned_noted = False  # per process (each data-loading worker says it once)


def _note_turned(path: str | Path, tag: int) -> None:
    """Say once that annotated pictures carry an orientation tag: a turn that swaps width and height shows in
    the annotations' size (an error), a half turn or a mirror does not."""
    global _turned_noted
    if not _turned_noted:
        _turned_noted = True
        warnings.warn(
            f"{path} (and maybe others) has EXIF orientation {tag}: pictures are read upright, as predict reads them, "
            "so its boxes or label map must be in upright pixels (a half turn or a mirror cannot be told from their "
            "size)",
            stacklevel=2,
        )


@contextlib.contextmanager
def unreadable_as_usage_error(path: str | Path):
    """PIL's errors for a file it cannot decode (truncated, not an image) as one line naming the file."""
    try:
        yield
    except (OSError, SyntaxError, ValueError) as err:
        if isinstance(err, UsageError):
            raise
        raise UsageError(f"{path}: cannot read it as an image ({type(err).__name__}: {err})") from err


def exif_rotation_error(what: str, path: str | Path, stored: tuple[int, int], upright: tuple[int, int]) -> str:
    """The error where annotations fit a picture's stored pixels and not its upright ones (an EXIF rotation)."""
    return (
        f"{path}: {what} fits the file's stored {stored[0]} x {stored[1]} pixels, but its EXIF orientation turns it "
        f"to {upright[0]} x {upright[1]}, and linvit reads pictures upright (as predict does, and detectron2 and "
        "OpenCV): save the picture upright (PIL.ImageOps.exif_transpose) or drop its orientation tag"
    )


def upright_rgb(image: Image.Image) -> Image.Image:
    """EXIF orientation applied, then to_rgb (exif_transpose copies the whole picture even with no tag to apply,
    which made reading a 683 x 512 JPEG 2.8 ms instead of 1.2 here: it runs only where the tag turns or mirrors)."""
    if orientation(image) != 1:
        image = ImageOps.exif_transpose(image)
    return to_rgb(image)


def orientation(image: Image.Image) -> int:
    """The EXIF orientation tag (1: stored as shown, 2-8: mirrored and/or turned), 1 without one."""
    return image.getexif().get(ORIENTATION, 1)


def to_rgb(image: Image.Image) -> Image.Image:
    """8-bit RGB: 16-bit, 32-bit and float greyscale scaled to 0..255, transparency composited on white (a plain
    convert("RGB") clips 16-bit values to white and drops the alpha channel, whatever the colour under it)."""
    if image.mode in ("I;16", "I;16B", "I;16L", "I", "F"):  # 16-bit, 32-bit or float greyscale: scale to 0..255
        values = np.asarray(image, dtype=np.float64)
        top = 65535.0 if image.mode.startswith("I;16") or values.max() > 255 else 255.0
        if image.mode == "F" and values.max() <= 1.0:
            top = 1.0  # float images in [0, 1]
        image = Image.fromarray(np.clip(values / top * 255.0, 0, 255).round().astype(np.uint8), mode="L")
    if image.mode in ("RGBA", "LA", "PA") or (image.mode == "P" and "transparency" in image.info):
        rgba = image.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, rgba).convert("RGB")
    return image.convert("RGB")
