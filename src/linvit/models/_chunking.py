"""Token-chunked inference: when it runs (the one rule every family follows) and how, outside the model classes.

At inference over many tokens, token-wise work (norms, MLPs, the streaming passes of the mixers that allow them)
runs over chunks of tokens with the residual stream updated in place, so peak memory stays a small multiple of
one N x C activation. The models call these helpers from forward_features; each layer exposes what its own
streaming needs (InfSA mixers: residual_streamed, WeightFormer blocks: forward_chunked, the patch embedding:
row_bands), so nothing here reads a layer's internals.
"""

from __future__ import annotations

import torch

from ..errors import UsageError
from ..layers.graph_capture import stateless_call

# Inputs of at least AUTO_CHUNK_MIN_TOKENS tokens (a 4096 x 4096 image at patch 16) run in chunks of
# AUTO_TOKEN_CHUNK tokens unless the model's token_chunk says otherwise: at 9216 x 9216 the whole-tensor
# path of the 4-layer models needs ~16 GB, the chunked one a few N x C activations.
AUTO_CHUNK_MIN_TOKENS = 2**16
AUTO_TOKEN_CHUNK = 2**14


def check_token_chunk(setting: object) -> None:
    """A one-line ValueError for a token_chunk that is not "auto", None / 0 or a positive int."""
    if (
        setting == "auto"
        or setting is None
        or (isinstance(setting, int) and not isinstance(setting, bool) and setting >= 0)
    ):
        return
    raise UsageError(f"token_chunk must be 'auto', None, 0 or a positive int; got {setting!r}")


def resolve_token_chunk(setting: int | str | None, num_tokens: int) -> int | None:
    """Tokens per chunk for a forward over num_tokens, or None for the whole-tensor path.

    setting: "auto" (AUTO_TOKEN_CHUNK from AUTO_CHUNK_MIN_TOKENS on), a chunk size, or None / 0 (off).
    Chunking is inference only: under autograd, torch.compile or tracing the whole-tensor path runs.
    """
    if torch.is_grad_enabled() or stateless_call():
        return None
    if setting == "auto":
        return AUTO_TOKEN_CHUNK if num_tokens >= AUTO_CHUNK_MIN_TOKENS else None
    return setting or None


class TokenChunking:
    """The token_chunk setting of a model with a patch embedding (mixed into InfViT and WeightFormer)."""

    def set_token_chunk(self, chunk: int | str | None) -> None:
        """Tokens per chunk, "auto", or None (off) for inference; see the model's docstring."""
        check_token_chunk(chunk)
        self.token_chunk = chunk

    def token_chunk_for(self, images: torch.Tensor) -> int | None:
        """Tokens per chunk for a forward of these images, None for the whole-tensor path."""
        if stateless_call():
            return None
        h, w = self.patch_embed.dynamic_feat_size(images.shape[-2:])
        return resolve_token_chunk(self.token_chunk, h * w)


def token_spans(num_tokens: int, chunk: int) -> list[tuple[int, int]]:
    """(start, end) of consecutive chunks of ``chunk`` tokens covering num_tokens."""
    return [(s, min(s + chunk, num_tokens)) for s in range(0, num_tokens, chunk)]


@torch.no_grad()
def vit_features_chunked(vit, images: torch.Tensor, chunk: int) -> torch.Tensor:
    """timm VisionTransformer.forward_features with token-wise work in chunks, the residual stream in place.

    Each mixer adds its output through its residual_streamed when it has one (timm's softmax Attention mixes
    the whole input). With ``vit.whole_mixer_inputs`` (the importance-map capture), every mixer is called once
    on its whole input, so forward hooks see it, while norms and MLPs stay chunked: the largest activations,
    the MLP's 4C-wide ones, never exist for all tokens at once.
    """
    x = vit.norm_pre(vit.patch_drop(vit.pos_drop(_vit_embed_chunked(vit, images, chunk))))
    spans = token_spans(x.shape[1], chunk)
    for blk in vit.blocks:
        attn = blk.attn
        if vit.whole_mixer_inputs:
            x.add_(blk.ls1(attn(blk.norm1(x))))  # attn read its own normalised copy: in place is safe
        elif hasattr(attn, "residual_streamed"):
            x = attn.residual_streamed(x, spans, blk.norm1, blk.ls1)
        else:
            x = x + blk.ls1(attn(blk.norm1(x)))
        for s, e in spans:
            x[:, s:e] += blk.ls2(blk.mlp(blk.norm2(x[:, s:e])))
    for s, e in spans:
        x[:, s:e] = vit.norm(x[:, s:e])
    return x


def _vit_embed_chunked(vit, images: torch.Tensor, chunk: int) -> torch.Tensor:
    """Patch embedding + position embedding with one token-sized tensor alive (the output).

    The tokens are embedded in bands of patch rows, each written straight into the (prefix + N, C) buffer;
    the prefix tokens and the resampled position embedding are added after (_add_position_bands).
    """
    B, P = images.shape[0], vit.num_prefix_tokens
    H, W, bands = _embedded_bands(vit, images, chunk)
    x = None
    for r0, r1, embed in bands:
        tokens = embed()
        if x is None:
            C = tokens.shape[-1]
            x = torch.empty(B, P + H * W, C, dtype=tokens.dtype, device=tokens.device)
        x[:, P + r0 * W : P + r1 * W].view(B, r1 - r0, W, C).copy_(tokens)
        del tokens
    prefix = [t.expand(B, -1, -1) for t in (vit.cls_token, vit.reg_token) if t is not None]
    if prefix:
        x[:, :P] = torch.cat(prefix, dim=1)
    if vit.pos_embed is None:
        return x
    return _add_position_bands(vit, x, H, W, chunk)


def _add_position_bands(vit, x: torch.Tensor, H: int, W: int, chunk: int) -> torch.Tensor:
    """x + the position table resampled to the H x W grid, in bands of rows: the bicubic resampling is
    separable, so each band is interpolated along W from a small (H, grid_w) intermediate instead of N x C."""
    P, C, pos = vit.num_prefix_tokens, x.shape[-1], vit.pos_embed
    pos_prefix = 0 if vit.no_embed_class else P
    if pos_prefix:
        x[:, :P] += pos[:, :P]
    gh, gw = vit.patch_embed.grid_size
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


def _embedded_bands(vit, images: torch.Tensor, chunk: int) -> tuple[int, int, list]:
    """The token grid (H, W) and (first row, end row, embed) per band of about chunk tokens, embed() giving the
    band's (B, rows, W, C) tokens; a fixed-size or overlapping embedding is one band."""
    embedding = vit.patch_embed
    if not vit.dynamic_img_size or not embedding.rows_embed_apart():
        tokens = embedding(images)
        tokens = tokens if tokens.dim() == 4 else tokens.view(tokens.shape[0], *embedding.grid_size, -1)
        return tokens.shape[1], tokens.shape[2], [(0, tokens.shape[1], lambda: tokens)]
    H, W = embedding.dynamic_feat_size(images.shape[-2:])
    return H, W, embedding.row_bands(images, max(1, chunk // W))


@torch.no_grad()
def weightformer_features_chunked(model, x: torch.Tensor, grid_size: tuple[int, int], chunk: int) -> torch.Tensor:
    """WeightFormer's blocks and final norm over row bands of embedded tokens x (B, N, C), in place.

    Bands have an even number of grid rows, so the dynamic layers' 2x2 pooling windows stay in one band.
    """
    band_rows = max(2, chunk // grid_size[1] // 2 * 2)
    for blk in model.blocks:
        x = blk.forward_chunked(x, grid_size, band_rows)
    band = band_rows * grid_size[1]
    for s in range(0, x.shape[1], band):
        x[:, s : s + band] = model.norm(x[:, s : s + band])
    return x
