"""timm-registered model families; importing this package registers every linvit model."""

from . import infvit, weightformer
from ._cfg import PUBLISHED
from ._input import patch_size
from .dit import DiT, create_dit
from .infvit import InfViT
from .variants import apply_variant, check_model_name, create_any_size, create_model, create_variant, split_name
from .weightformer import WeightFormer

__all__ = [
    "PUBLISHED",
    "patch_size",
    "InfViT",
    "WeightFormer",
    "DiT",
    "create_dit",
    "infvit",
    "weightformer",
    "create_variant",
    "create_any_size",
    "apply_variant",
    "split_name",
    "create_model",
    "check_model_name",
]
