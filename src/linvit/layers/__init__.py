"""nn.Modules built on linvit.ops: InfSA attentions (timm attn_layer compatible) and dynamic layers."""

from .infsa_attention import LinearInfSAAttention, PureInfSAAttention

__all__ = ["PureInfSAAttention", "LinearInfSAAttention"]
