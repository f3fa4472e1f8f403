"""Data: ImageNet-layout folders (timm transforms), the embedded cluttered-MNIST builder, box readers."""

from .boxes import boxes_for, load_boxes, read_voc_xml
from .cluttered_mnist import build_cluttered_mnist, load_mnist_5k
from .folder import SafeImageFolder, collate_images

__all__ = [
    "build_cluttered_mnist",
    "load_mnist_5k",
    "load_boxes",
    "read_voc_xml",
    "boxes_for",
    "SafeImageFolder",
    "collate_images",
]
