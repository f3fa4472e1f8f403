"""nn.Modules built on linvit.ops: InfSA attentions (timm attn_layer compatible) and dynamic layers."""

from .dynamic import CONV_PREDICTORS, LINEAR_PREDICTORS, DynamicDWConv, DynamicLinear
from .infsa_attention import KatzInfSAAttention, LinearInfSAAttention, PureInfSAAttention

__all__ = [
    "PureInfSAAttention",
    "LinearInfSAAttention",
    "KatzInfSAAttention",
    "DynamicLinear",
    "DynamicDWConv",
    "LINEAR_PREDICTORS",
    "CONV_PREDICTORS",
]
