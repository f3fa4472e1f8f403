"""timm-registered model families; importing this package registers every linvit model."""

from . import infvit
from .infvit import InfViT

__all__ = ["InfViT", "infvit"]
