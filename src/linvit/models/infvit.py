"""The InfViT family: timm VisionTransformers whose attention is softmax, pure InfSA or Linear-InfSA.

Shapes follow DESIGN.md: the 4-layer models are 1024 wide with 16 heads and MLP ratio 4 (our
reading of the paper's parameter counts), tiny/small are 12 layers at width 192/384 with 3/6 heads.
Every model is a plain timm VisionTransformer underneath (class token, pre-norm blocks, final LN),
so forward_intermediates, features_only, grad checkpointing and checkpoint filters all apply.
"""

from __future__ import annotations

from functools import partial

import torch
from timm.layers import Attention, register_notrace_function, resample_abs_pos_embed
from timm.models import build_model_with_cfg, generate_default_cfgs, register_model
from timm.models.vision_transformer import VisionTransformer, checkpoint_filter_fn

from ..errors import UsageError
from ..layers import KatzInfSAAttention, LinearInfSAAttention, PureInfSAAttention
from ..layers.graph_capture import is_fx_tracing, parent_method, stateless_call
from ..layers.infsa_attention import FEATURE_MAPS, LINEAR_VARIANTS, PURE_IMPLS, check_choice
from ._cfg import model_cfg, require_weights
from ._chunking import check_token_chunk, resolve_token_chunk
from ._input import CheckedPatchEmbed

MIXERS = {
    "softmax": Attention,
    "pure": PureInfSAAttention,
    "linear": LinearInfSAAttention,
    "katz": KatzInfSAAttention,
}


class InfViT(VisionTransformer):
    """timm VisionTransformer with a selectable token mixer and validated input.

    Args:
        mixer: "softmax", "pure", "linear" or "katz" (see MIXERS).
        gamma_init: initial per-head discount of InfSA mixers.
        attn_impl: pure InfSA form, "auto" | "dense" | "chunked".
        fold_kv: Linear-InfSA folds the K/V projections (identical outputs, fewer FLOPs).
        linear_variant: Linear-InfSA's score map, "release" (the paper's) or a stabilised form ("floor",
            "softplus", "elu+1"; docs/spec/infsa.md section 3.1).
        feature_map: Katz-InfSA's non-negative feature map, "relu" or "elu+1".
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
        attn_impl: str = "auto",
        fold_kv: bool = True,
        linear_variant: str = "release",
        feature_map: str = "relu",
        check_finite: bool = False,
        token_chunk: int | str | None = "auto",
        **kwargs,
    ) -> None:
        if mixer not in MIXERS:
            raise UsageError(f"unknown mixer {mixer!r}; choose from {sorted(MIXERS)}")
        check_choice("attn_impl", attn_impl, PURE_IMPLS)
        check_choice("fold_kv", fold_kv, (True, False))
        check_choice("linear_variant", linear_variant, LINEAR_VARIANTS)
        check_choice("feature_map", feature_map, FEATURE_MAPS)
        check_token_chunk(token_chunk)
        kwargs.setdefault("dynamic_img_size", True)
        super().__init__(attn_layer=MIXERS[mixer], embed_layer=CheckedPatchEmbed, **kwargs)
        self.mixer = mixer
        self.token_chunk = token_chunk
        self.whole_mixer_inputs = False  # set by linvit.explain's capture: see _forward_features_chunked
        self.patch_embed.check_finite = check_finite
        for module in self.modules():
            if isinstance(module, PureInfSAAttention):
                module.impl = attn_impl
            if isinstance(module, LinearInfSAAttention):
                module.fold_kv = fold_kv
                module.linear_variant = linear_variant
            if isinstance(module, KatzInfSAAttention):
                module.feature_map = feature_map
            if hasattr(module, "theta") and gamma_init != module.gamma_init:
                module.gamma_init = gamma_init
                module.reset_parameters()

    _timm_pos_embed = parent_method(VisionTransformer._pos_embed, "_timm_pos_embed")
    _timm_forward_features = parent_method(VisionTransformer.forward_features, "_timm_forward_features")

    def _pos_embed(self, x: torch.Tensor) -> torch.Tensor:
        """timm's position embedding; under FX tracing the resampling is one opaque node (it needs concrete sizes)."""
        if not torch.jit.is_scripting():
            if is_fx_tracing() and self.dynamic_img_size and self.pos_embed is not None:
                return self._pos_embed_traced(x)
        return self._timm_pos_embed(x)

    def _pos_embed_traced(self, x: torch.Tensor) -> torch.Tensor:
        """timm's dynamic-size _pos_embed with the table from resampled_position_table (an FX leaf)."""
        B, H, W, C = x.shape
        prefix = 0 if self.no_embed_class else self.num_prefix_tokens
        gh, gw = self.patch_embed.grid_size
        pos = resampled_position_table(self.pos_embed, x, [gh, gw], prefix)
        x = x.view(B, H * W, C)
        prefix_tokens = [t.expand(B, -1, -1) for t in (self.cls_token, self.reg_token) if t is not None]
        if self.no_embed_class:  # as timm: add, then prepend the prefix tokens (or prepend, then add)
            x = x + pos
        if prefix_tokens:
            x = torch.cat([*prefix_tokens, x], dim=1)
        if not self.no_embed_class:
            x = x + pos
        return self.pos_drop(x)

    def token_chunk_for(self, images: torch.Tensor) -> int | None:
        """Tokens per chunk for a forward of these images, None for the whole-tensor path."""
        if stateless_call():
            return None
        h, w = self.patch_embed.dynamic_feat_size(images.shape[-2:])
        return resolve_token_chunk(self.token_chunk, h * w)

    def forward_features(
        self, x: torch.Tensor, attn_mask: torch.Tensor | None = None, is_causal: bool = False
    ) -> torch.Tensor:
        if not torch.jit.is_scripting():
            chunk = self.token_chunk_for(x)
            if chunk is not None and attn_mask is None and not is_causal:
                return self._forward_features_chunked(x, chunk)
        return self._timm_forward_features(x, attn_mask, is_causal)

    def _embed_chunked(self, images: torch.Tensor, chunk: int) -> torch.Tensor:
        """Patch embedding + position embedding with one token-sized tensor alive (the output).

        The tokens are embedded in bands of patch rows, each written straight into the (prefix + N, C) buffer,
        and the resampled position embedding is added in bands of rows: the bicubic resampling is separable,
        so each band is interpolated along W from a small (H, grid_w) intermediate instead of N x C.
        """
        B, P = images.shape[0], self.num_prefix_tokens
        H, W, bands = self._embedded_bands(images, chunk)
        x = None
        for r0, r1, embed in bands:
            tokens = embed()
            if x is None:
                C = tokens.shape[-1]
                x = torch.empty(B, P + H * W, C, dtype=tokens.dtype, device=tokens.device)
            x[:, P + r0 * W : P + r1 * W].view(B, r1 - r0, W, C).copy_(tokens)
            del tokens
        prefix = [t.expand(B, -1, -1) for t in (self.cls_token, self.reg_token) if t is not None]
        if prefix:
            x[:, :P] = torch.cat(prefix, dim=1)
        pos = self.pos_embed
        if pos is None:
            return x
        pos_prefix = 0 if self.no_embed_class else P
        if pos_prefix:
            x[:, :P] += pos[:, :P]
        gh, gw = self.patch_embed.grid_size
        grid = pos[:, pos_prefix:].reshape(1, gh, gw, C).permute(0, 3, 1, 2).float()
        resize = dict(mode="bicubic", align_corners=False, antialias=True)  # as timm's resample_abs_pos_embed
        cols = torch.nn.functional.interpolate(grid, size=(H, gw), **resize) if (H, W) != (gh, gw) else grid
        rows = max(1, chunk // W)
        for r0 in range(0, H, rows):
            r1 = min(H, r0 + rows)
            band = cols[:, :, r0:r1]
            if (H, W) != (gh, gw):
                band = torch.nn.functional.interpolate(band, size=(r1 - r0, W), **resize)
            x[:, P + r0 * W : P + r1 * W] += band.permute(0, 2, 3, 1).reshape(1, -1, C).to(x.dtype)
        return x

    def _embedded_bands(self, images: torch.Tensor, chunk: int) -> tuple[int, int, list]:
        """The token grid (H, W) and a list of (first row, end row, band) whose bands are embedded lazily, each
        (B, rows, W, C) for about chunk tokens: patches do not overlap, so embedding a band of patch rows equals
        that band of the whole embedding."""
        if not self.dynamic_img_size or self.patch_embed.proj.stride != self.patch_embed.proj.kernel_size:
            tokens = self.patch_embed(images)  # one piece: a fixed-size or overlapping embedding
            tokens = tokens if tokens.dim() == 4 else tokens.view(tokens.shape[0], *self.patch_embed.grid_size, -1)
            return tokens.shape[1], tokens.shape[2], [(0, tokens.shape[1], lambda: tokens)]
        H, W = self.patch_embed.dynamic_feat_size(images.shape[-2:])
        step, rows = self.patch_embed.patch_size[0], max(1, chunk // W)
        spans = [(r0, min(H, r0 + rows)) for r0 in range(0, H, rows)]
        return (
            H,
            W,
            [(r0, r1, partial(self._embed_rows, images, r0 * step, r1 * step if r1 < H else None)) for r0, r1 in spans],
        )

    def _embed_rows(self, images: torch.Tensor, top: int, bottom: int | None) -> torch.Tensor:
        return self.patch_embed(images[:, :, top:bottom])

    @torch.no_grad()
    def _forward_features_chunked(self, x: torch.Tensor, chunk: int) -> torch.Tensor:
        """Inference with token-wise work in chunks and the residual stream updated in place.

        With ``whole_mixer_inputs`` (the importance-map capture), every mixer is called once on its whole
        input, so forward hooks see it, while norms and MLPs stay chunked: the largest activations, the
        MLP's 4C-wide ones, never exist for all tokens at once.
        """
        x = self.norm_pre(self.patch_drop(self.pos_drop(self._embed_chunked(x, chunk))))
        N = x.shape[1]
        spans = [(s, min(s + chunk, N)) for s in range(0, N, chunk)]
        for blk in self.blocks:
            attn = blk.attn
            if self.whole_mixer_inputs:
                x.add_(blk.ls1(attn(blk.norm1(x))))  # attn read its own normalised copy: in place is safe
            elif isinstance(attn, LinearInfSAAttention) and attn.fold_kv and isinstance(attn.k_norm, torch.nn.Identity):
                x.add_(blk.ls1(attn.pooled_output(_Chunks(x, spans, blk.norm1))))  # (B, 1, C) broadcast
            elif isinstance(attn, KatzInfSAAttention):
                mixing = attn.streamed_mixing(_Chunks(x, spans, blk.norm1))  # pass 1 reads every token
                for s, e in spans:  # pass 2: each span reads only its own rows, so it is updated in place
                    x[:, s:e] += blk.ls1(attn.streamed_output(blk.norm1(x[:, s:e]), mixing))
            else:
                x = x + blk.ls1(attn(blk.norm1(x)))
            for s, e in spans:
                x[:, s:e] += blk.ls2(blk.mlp(blk.norm2(x[:, s:e])))
        for s, e in spans:
            x[:, s:e] = self.norm(x[:, s:e])
        return x

    def set_token_chunk(self, chunk: int | str | None) -> None:
        """Tokens per chunk, "auto", or None (off) for inference; see the class docstring."""
        check_token_chunk(chunk)
        self.token_chunk = chunk

    def no_weight_decay(self) -> set[str]:
        """timm's set plus every discount parameter: decaying theta would pull gamma toward 0.5."""
        names = {n for n, _ in self.named_parameters() if n.endswith(".theta")}
        return super().no_weight_decay() | names


def resampled_position_table(pos_embed: torch.Tensor, x: torch.Tensor, grid: list[int], prefix: int) -> torch.Tensor:
    """The position table resampled (timm's bicubic) from the trained grid to x's (B, H, W, C) token grid.

    An FX leaf in traced graphs; written so that TorchScript compiles it too (FX graph, then torch.jit.script).
    """
    return resample_abs_pos_embed(pos_embed, [x.shape[1], x.shape[2]], grid, num_prefix_tokens=prefix)


torch.fx.wrap("resampled_position_table")
register_notrace_function(resampled_position_table)  # the same in timm's FX helpers


class _Chunks:
    """Re-iterable view of fn(x[:, s:e]) over token spans (the streaming passes iterate twice)."""

    def __init__(self, x: torch.Tensor, spans: list[tuple[int, int]], fn) -> None:
        self.x, self.spans, self.fn = x, spans, fn

    def __iter__(self):
        return (self.fn(self.x[:, s:e]) for s, e in self.spans)


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


def _create(variant: str, mixer: str, shape: str, pretrained: bool = False, **kwargs) -> InfViT:
    require_weights(variant, pretrained, kwargs)
    model_args = dict(patch_size=16, mixer=mixer, **SHAPES[shape])
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


@register_model
def katz_infvit_4l_patch16_224(pretrained: bool = False, **kwargs) -> InfViT:
    """Katz-InfSA ViT (exact infinite-hop series, linear time), 4 layers, width 1024, 16 heads."""
    return _create("katz_infvit_4l_patch16_224", "katz", "4l", pretrained, **kwargs)


@register_model
def katz_infvit_tiny_patch16_224(pretrained: bool = False, **kwargs) -> InfViT:
    """Katz-InfSA ViT-Tiny: 12 layers, width 192, 3 heads."""
    return _create("katz_infvit_tiny_patch16_224", "katz", "tiny", pretrained, **kwargs)


@register_model
def katz_infvit_small_patch16_224(pretrained: bool = False, **kwargs) -> InfViT:
    """Katz-InfSA ViT-Small: 12 layers, width 384, 6 heads."""
    return _create("katz_infvit_small_patch16_224", "katz", "small", pretrained, **kwargs)
