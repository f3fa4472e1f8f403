"""Old home of linvit.prediction, kept only because README.md and docs/classification.md showed
``linvit.inference.find_images`` before issue 47.3 moved prediction into one package: code written against that
keeps working, with a DeprecationWarning. No logic lives here."""

import warnings

from .prediction import find_images, load_image, predict, prepare_image

warnings.warn(
    "linvit.inference moved to linvit.prediction (linvit.prediction.find_images, ...)", DeprecationWarning, stacklevel=2
)

__all__ = ["find_images", "load_image", "predict", "prepare_image"]
