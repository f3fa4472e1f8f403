"""timm-registered model families; importing this package registers every linvit model."""

from . import infvit, weightformer
from .infvit import InfViT
from .weightformer import WeightFormer

__all__ = ["InfViT", "WeightFormer", "infvit", "weightformer"]
