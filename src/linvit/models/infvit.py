"""The InfViT family: timm VisionTransformers whose attention is softmax, pure InfSA or Linear-InfSA.

Shapes follow DESIGN.md: the 4-layer models are 1024 wide with 16 heads and MLP ratio 4 (our
reading of the paper's parameter counts), tiny/small are 12 layers at width 192/384 with 3/6 heads.
Every model is a plain timm VisionTransformer underneath (class token, pre-norm blocks, final LN),
so forward_intermediates, features_only, grad checkpointing and checkpoint filters all apply.
"""

from __future__ import annotations

from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from timm.layers import Attention
from timm.models import build_model_with_cfg, generate_default_cfgs, register_model
from timm.models.vision_transformer import VisionTransformer, checkpoint_filter_fn

from ..layers import LinearInfSAAttention, PureInfSAAttention
from ._input import CheckedPatchEmbed

MIXERS = {"softmax": Attention, "pure": PureInfSAAttention, "linear": LinearInfSAAttention}


class InfViT(VisionTransformer):
    """timm VisionTransformer with a selectable token mixer and validated input.

    Args:
        mixer: "softmax", "pure" or "linear" (see MIXERS).
        gamma_init: initial per-head discount of InfSA mixers.
        attn_impl: pure InfSA form, "auto" | "dense" | "chunked".
        fold_kv: Linear-InfSA folds the K/V projections (identical outputs, fewer FLOPs).
        check_finite: reject NaN/Inf inputs with a ValueError (one extra pass over the input).
        **kwargs: VisionTransformer arguments. dynamic_img_size defaults to True: these models are
            meant for any resolution, with position embeddings resampled to the token grid.
    """

    def __init__(
        self,
        mixer: str = "softmax",
        gamma_init: float = 0.9,
        attn_impl: str = "auto",
        fold_kv: bool = True,
        check_finite: bool = False,
        **kwargs,
    ) -> None:
        if mixer not in MIXERS:
            raise ValueError(f"unknown mixer {mixer!r}; choose from {sorted(MIXERS)}")
        kwargs.setdefault("dynamic_img_size", True)
        super().__init__(attn_layer=MIXERS[mixer], embed_layer=CheckedPatchEmbed, **kwargs)
        self.mixer = mixer
        self.patch_embed.check_finite = check_finite
        for module in self.modules():
            if isinstance(module, PureInfSAAttention):
                module.impl = attn_impl
            if isinstance(module, LinearInfSAAttention):
                module.fold_kv = fold_kv
            if hasattr(module, "theta") and gamma_init != module.gamma_init:
                module.gamma_init = gamma_init
                module.reset_parameters()

    def no_weight_decay(self) -> set[str]:
        """timm's set plus every discount parameter: decaying theta would pull gamma toward 0.5."""
        names = {n for n, _ in self.named_parameters() if n.endswith(".theta")}
        return super().no_weight_decay() | names


def _cfg(**kwargs) -> dict:
    return {
        "url": "",
        "num_classes": 1000,
        "input_size": (3, 224, 224),
        "pool_size": None,
        "crop_pct": 0.9,
        "interpolation": "bicubic",
        "fixed_input_size": False,
        "mean": IMAGENET_DEFAULT_MEAN,
        "std": IMAGENET_DEFAULT_STD,
        "first_conv": "patch_embed.proj",
        "classifier": "head",
        "license": "mit",
        **kwargs,
    }


SHAPES = {
    "4l": dict(embed_dim=1024, depth=4, num_heads=16, mlp_ratio=4.0),
    "24l": dict(embed_dim=1024, depth=24, num_heads=16, mlp_ratio=4.0),
    "tiny": dict(embed_dim=192, depth=12, num_heads=3, mlp_ratio=4.0),
    "small": dict(embed_dim=384, depth=12, num_heads=6, mlp_ratio=4.0),
}

default_cfgs = generate_default_cfgs(
    {
        "vit_4l_patch16_224": _cfg(),
        "infvit_4l_patch16_224": _cfg(),
        "linear_infvit_4l_patch16_224": _cfg(),
        "infvit_24l_patch16_224": _cfg(),
        "infvit_tiny_patch16_224": _cfg(),
        "infvit_small_patch16_224": _cfg(),
        "linear_infvit_tiny_patch16_224": _cfg(),
        "linear_infvit_small_patch16_224": _cfg(),
    }
)


def _create(variant: str, mixer: str, shape: str, pretrained: bool = False, **kwargs) -> InfViT:
    model_args = dict(patch_size=16, mixer=mixer, **SHAPES[shape])
    return build_model_with_cfg(
        InfViT,
        variant,
        pretrained,
        pretrained_filter_fn=checkpoint_filter_fn,
        feature_cfg=dict(out_indices=kwargs.pop("out_indices", 3), feature_cls="getter"),
        **dict(model_args, **kwargs),
    )


@register_model
def vit_4l_patch16_224(pretrained: bool = False, **kwargs) -> InfViT:
    """Softmax ViT baseline, 4 layers, width 1024, 16 heads (timm fused attention)."""
    return _create("vit_4l_patch16_224", "softmax", "4l", pretrained, **kwargs)


@register_model
def infvit_4l_patch16_224(pretrained: bool = False, **kwargs) -> InfViT:
    """Pure InfSA ViT, 4 layers, width 1024, 16 heads."""
    return _create("infvit_4l_patch16_224", "pure", "4l", pretrained, **kwargs)


@register_model
def linear_infvit_4l_patch16_224(pretrained: bool = False, **kwargs) -> InfViT:
    """Linear-InfSA ViT, 4 layers, width 1024, 16 heads."""
    return _create("linear_infvit_4l_patch16_224", "linear", "4l", pretrained, **kwargs)


@register_model
def infvit_24l_patch16_224(pretrained: bool = False, **kwargs) -> InfViT:
    """Pure InfSA ViT, 24 layers, width 1024, 16 heads."""
    return _create("infvit_24l_patch16_224", "pure", "24l", pretrained, **kwargs)


@register_model
def infvit_tiny_patch16_224(pretrained: bool = False, **kwargs) -> InfViT:
    """Pure InfSA ViT-Tiny: 12 layers, width 192, 3 heads."""
    return _create("infvit_tiny_patch16_224", "pure", "tiny", pretrained, **kwargs)


@register_model
def infvit_small_patch16_224(pretrained: bool = False, **kwargs) -> InfViT:
    """Pure InfSA ViT-Small: 12 layers, width 384, 6 heads."""
    return _create("infvit_small_patch16_224", "pure", "small", pretrained, **kwargs)


@register_model
def linear_infvit_tiny_patch16_224(pretrained: bool = False, **kwargs) -> InfViT:
    """Linear-InfSA ViT-Tiny: 12 layers, width 192, 3 heads."""
    return _create("linear_infvit_tiny_patch16_224", "linear", "tiny", pretrained, **kwargs)


@register_model
def linear_infvit_small_patch16_224(pretrained: bool = False, **kwargs) -> InfViT:
    """Linear-InfSA ViT-Small: 12 layers, width 384, 6 heads."""
    return _create("linear_infvit_small_patch16_224", "linear", "small", pretrained, **kwargs)
