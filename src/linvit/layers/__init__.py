"""nn.Modules built on linvit.ops: InfSA attentions (timm attn_layer compatible) and dynamic layers."""

from .dynamic import CONV_PREDICTORS, LINEAR_PREDICTORS, DynamicDWConv, DynamicLinear
from .infsa_attention import KatzInfSAAttention, LinearInfSAAttention, PureInfSAAttention
from .katz_rows import KatzRowsAttention
from .linear_attention import LinearAttention

__all__ = [
    "PureInfSAAttention",
    "LinearInfSAAttention",
    "KatzInfSAAttention",
    "KatzRowsAttention",
    "LinearAttention",
    "DynamicLinear",
    "DynamicDWConv",
    "LINEAR_PREDICTORS",
    "CONV_PREDICTORS",
]
