"""The InfViT family: timm VisionTransformers whose attention is softmax, pure InfSA or Linear-InfSA.

Shapes follow DESIGN.md: the 4-layer models are 1024 wide with 16 heads and MLP ratio 4 (our
reading of the paper's parameter counts), tiny/small are 12 layers at width 192/384 with 3/6 heads.
Every model is a plain timm VisionTransformer underneath (class token, pre-norm blocks, final LN),
so forward_intermediates, features_only, grad checkpointing and checkpoint filters all apply.
"""

from __future__ import annotations

import torch
from timm.models import build_model_with_cfg, generate_default_cfgs, register_model
from timm.models.vision_transformer import VisionTransformer, checkpoint_filter_fn

from ..errors import UsageError
from ..layers import KatzInfSAAttention, LinearAttention, LinearInfSAAttention, PureInfSAAttention
from ..layers.feature_maps import FeatureMap
from ..layers.graph_capture import is_fx_tracing, parent_method, traced_pos_embed
from ..layers.infsa_attention import FoldKV, PureImpl, check_choice
from ..mixers import get_mixer, list_mixers
from ..ops.infsa import LinearVariant
from ._cfg import model_cfg, require_weights
from ._chunking import TokenChunking, check_token_chunk, vit_features_chunked
from ._input import CheckedPatchEmbed


def __getattr__(name: str):
    """``MIXERS``, the {name: layer class} of the mixer registry (linvit.mixers) as it is now; kept for its
    readers."""
    if name == "MIXERS":
        return {n: get_mixer(n).cls for n in list_mixers()}
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _with_option(mixer: str, record, feature_map, linear_variant):
    """(feature_map, linear_variant) with the option of a mixer spelled as convert spells it ("katz_rows:hedgehog",
    "linear_infsa:floor"); an option that contradicts the keyword is one line."""
    name, _, option = mixer.partition(":")
    if not option:
        return feature_map, linear_variant
    if record.option is None or record.option.name not in ("feature_map", "linear_variant"):
        raise UsageError(f"mixer {name!r} takes no ':option'; got {mixer!r}")
    given = feature_map if record.option.name == "feature_map" else linear_variant
    unset = None if record.option.name == "feature_map" else "release"  # the keywords' own defaults
    if given not in (unset, option):
        raise UsageError(f"mixer={mixer!r} contradicts {record.option.name}={given!r}")
    return (option, linear_variant) if record.option.name == "feature_map" else (feature_map, option)


class InfViT(VisionTransformer, TokenChunking):
    """timm VisionTransformer with a selectable token mixer and validated input.

    Args:
        mixer: a registered mixer's name (linvit.list_mixers(): "softmax", "pure_infsa", "linear_infsa",
            "katz_infsa", "katz_rows", "linear_attention", or one of yours), optionally with its option as
            linvit.convert spells it ("katz_rows:hedgehog"); the old "pure", "linear", "katz" still work.
        gamma_init: initial per-head discount of InfSA mixers.
        attn_impl: pure InfSA form, "auto" | "dense" | "chunked".
        fold_kv: Linear-InfSA folds the K/V projections (identical outputs, fewer FLOPs).
        linear_variant: Linear-InfSA's score map, "release" (the paper's) or a stabilised form ("floor",
            "softplus", "elu+1"; docs/spec/infsa.md section 3.1).
        feature_map: the non-negative feature map of Katz-InfSA (default "relu") and of linear attention
            (default "elu+1"): "relu", "elu+1" or the learned "hedgehog" (per-head [softmax(x W), softmax(-x W)],
            layers.feature_maps).
        feature_dim: the learned map's size f (2 f features; default the head dim).
        check_finite: reject NaN/Inf inputs with a ValueError (one extra pass over the input).
        token_chunk: at inference (no autograd), run token-wise work (norms, MLP, Linear- and
            Katz-InfSA's streaming passes) over this many tokens at a time, updating the residual
            stream in place, so peak memory stays a small multiple of one N x C activation.
            "auto" (default): AUTO_TOKEN_CHUNK from AUTO_CHUNK_MIN_TOKENS tokens on, else off;
            None or 0 = off. Compiled and traced graphs always take the whole-tensor path.
        **kwargs: VisionTransformer arguments. dynamic_img_size defaults to True: these models are
            meant for any resolution, with position embeddings resampled to the token grid.
    """

    def __init__(
        self,
        mixer: str = "softmax",
        gamma_init: float = 0.9,
        attn_impl: PureImpl = "auto",
        fold_kv: FoldKV = True,
        linear_variant: LinearVariant = "release",
        feature_map: FeatureMap | None = None,
        feature_dim: int | None = None,
        check_finite: bool = False,
        token_chunk: int | str | None = "auto",
        **kwargs,
    ) -> None:
        record = get_mixer(mixer.partition(":")[0])  # a one-line error for an unknown one
        feature_map, linear_variant = _with_option(mixer, record, feature_map, linear_variant)
        check_choice("attn_impl", attn_impl, PureImpl)
        check_choice("fold_kv", fold_kv, FoldKV)
        check_choice("linear_variant", linear_variant, LinearVariant)
        if feature_map is not None:
            check_choice("feature_map", feature_map, FeatureMap)
        check_token_chunk(token_chunk)
        kwargs.setdefault("dynamic_img_size", True)
        super().__init__(attn_layer=record.cls, embed_layer=CheckedPatchEmbed, **kwargs)
        self.mixer = record.name
        self.token_chunk = token_chunk
        self.whole_mixer_inputs = False  # set by linvit.explain's capture: see _chunking.vit_features_chunked
        self.patch_embed.check_finite = check_finite
        for module in self.modules():
            if isinstance(module, PureInfSAAttention):
                module.impl = attn_impl
            if isinstance(module, LinearInfSAAttention):
                module.fold_kv = fold_kv
                module.linear_variant = linear_variant
            if isinstance(module, (KatzInfSAAttention, LinearAttention)) and (feature_map or feature_dim):
                module.use_feature_map(feature_map or module.feature_map, feature_dim)
            if hasattr(module, "theta") and gamma_init != module.gamma_init:
                module.gamma_init = gamma_init
                module.reset_parameters()

    _timm_pos_embed = parent_method(VisionTransformer._pos_embed, "_timm_pos_embed")
    _timm_forward_features = parent_method(VisionTransformer.forward_features, "_timm_forward_features")

    def _pos_embed(self, x: torch.Tensor) -> torch.Tensor:
        """timm's position embedding; under FX tracing the resampling is one opaque node (it needs concrete sizes)."""
        if not torch.jit.is_scripting():
            if is_fx_tracing() and self.dynamic_img_size and self.pos_embed is not None:
                return traced_pos_embed(self, x)
        return self._timm_pos_embed(x)

    def forward_features(
        self, x: torch.Tensor, attn_mask: torch.Tensor | None = None, is_causal: bool = False
    ) -> torch.Tensor:
        """timm's forward_features, token-chunked at inference over many tokens (models/_chunking.py)."""
        if not torch.jit.is_scripting():
            chunk = self.token_chunk_for(x)
            if chunk is not None and attn_mask is None and not is_causal:
                return vit_features_chunked(self, x, chunk)
        return self._timm_forward_features(x, attn_mask, is_causal)

    def no_weight_decay(self) -> set[str]:
        """timm's set plus every discount parameter: decaying theta would pull gamma toward 0.5."""
        names = {n for n, _ in self.named_parameters() if n.endswith(".theta")}
        return super().no_weight_decay() | names


def checkpoint_filter(state_dict: dict, model: InfViT) -> dict:
    """timm's ViT checkpoint filter (position embeddings resampled, original layouts), plus InfSA's discounts.

    A softmax ViT/DeiT checkpoint has no discount parameters (theta); when it has none at all, each InfSA
    layer keeps its initial gamma, so a pretrained softmax model loads into infvit_* / linear_infvit_* /
    katz_infvit_* for fine-tuning. A checkpoint with only some of them is left as it is (a strict load
    then names the missing ones).
    """
    state_dict = checkpoint_filter_fn(state_dict, model)
    if not any(k.endswith(".theta") for k in state_dict):
        state_dict.update({k: v for k, v in model.state_dict().items() if k.endswith(".theta")})
    return state_dict


def _cfg(**kwargs) -> dict:
    return model_cfg(paper_ids="arXiv:2603.00175", **kwargs)


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
        "katz_infvit_4l_patch16_224": _cfg(),
        "katz_infvit_tiny_patch16_224": _cfg(),
        "katz_infvit_small_patch16_224": _cfg(),
    }
)


def _create(variant: str, default_mixer: str, shape: str, pretrained: bool = False, **kwargs) -> InfViT:
    """The family's model of that shape; ``mixer=`` (any registered one) replaces the name's default mixer."""
    require_weights(variant, pretrained, kwargs)
    model_args = dict(patch_size=16, mixer=default_mixer, **SHAPES[shape])
    return build_model_with_cfg(
        InfViT,
        variant,
        pretrained,
        pretrained_filter_fn=checkpoint_filter,
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
    return _create("infvit_4l_patch16_224", "pure_infsa", "4l", pretrained, **kwargs)


@register_model
def linear_infvit_4l_patch16_224(pretrained: bool = False, **kwargs) -> InfViT:
    """Linear-InfSA ViT, 4 layers, width 1024, 16 heads."""
    return _create("linear_infvit_4l_patch16_224", "linear_infsa", "4l", pretrained, **kwargs)


@register_model
def infvit_24l_patch16_224(pretrained: bool = False, **kwargs) -> InfViT:
    """Pure InfSA ViT, 24 layers, width 1024, 16 heads."""
    return _create("infvit_24l_patch16_224", "pure_infsa", "24l", pretrained, **kwargs)


@register_model
def infvit_tiny_patch16_224(pretrained: bool = False, **kwargs) -> InfViT:
    """Pure InfSA ViT-Tiny: 12 layers, width 192, 3 heads."""
    return _create("infvit_tiny_patch16_224", "pure_infsa", "tiny", pretrained, **kwargs)


@register_model
def infvit_small_patch16_224(pretrained: bool = False, **kwargs) -> InfViT:
    """Pure InfSA ViT-Small: 12 layers, width 384, 6 heads."""
    return _create("infvit_small_patch16_224", "pure_infsa", "small", pretrained, **kwargs)


@register_model
def linear_infvit_tiny_patch16_224(pretrained: bool = False, **kwargs) -> InfViT:
    """Linear-InfSA ViT-Tiny: 12 layers, width 192, 3 heads."""
    return _create("linear_infvit_tiny_patch16_224", "linear_infsa", "tiny", pretrained, **kwargs)


@register_model
def linear_infvit_small_patch16_224(pretrained: bool = False, **kwargs) -> InfViT:
    """Linear-InfSA ViT-Small: 12 layers, width 384, 6 heads."""
    return _create("linear_infvit_small_patch16_224", "linear_infsa", "small", pretrained, **kwargs)


@register_model
def katz_infvit_4l_patch16_224(pretrained: bool = False, **kwargs) -> InfViT:
    """Katz-InfSA ViT (exact infinite-hop series, linear time), 4 layers, width 1024, 16 heads."""
    return _create("katz_infvit_4l_patch16_224", "katz_infsa", "4l", pretrained, **kwargs)


@register_model
def katz_infvit_tiny_patch16_224(pretrained: bool = False, **kwargs) -> InfViT:
    """Katz-InfSA ViT-Tiny: 12 layers, width 192, 3 heads."""
    return _create("katz_infvit_tiny_patch16_224", "katz_infsa", "tiny", pretrained, **kwargs)


@register_model
def katz_infvit_small_patch16_224(pretrained: bool = False, **kwargs) -> InfViT:
    """Katz-InfSA ViT-Small: 12 layers, width 384, 6 heads."""
    return _create("katz_infvit_small_patch16_224", "katz_infsa", "small", pretrained, **kwargs)
