"""Prediction: a trained model on your own pictures, every task's in one package.

- classify.py: ``linvit.load_image``, ``linvit.predict`` and ``linvit predict`` (any classifier, --maps);
- dense.py: ``linvit detect predict`` and ``linvit segment predict`` (a finished run folder);
- detect.py, segment.py: one picture through a detector / segmenter, and its drawing;
- output.py: what every prediction command writes (JSON lines, one file per picture named after it).

The package is named prediction, not predict, so that ``linvit.predict`` stays the function.
"""

from ..data.images import find_images
from .classify import load_image, predict, prepare_image

__all__ = ["find_images", "load_image", "predict", "prepare_image"]
