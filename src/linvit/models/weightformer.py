"""WeightFormer: isotropic, no attention, dynamic weights in one block in three (docs/spec/weightformer.md).

State-dict names are the official release's (``patch_embed.proj``, ``init_norm``, ``blocks.{i}.linear1``,
``blocks.{i}.dwc``, ``norm``, ``head``), so its checkpoints load strictly. Unlike the release, the token
grid is carried explicitly, so any H x W divisible by the patch works (there is no position embedding).
No ``from __future__ import annotations``: FX graphs traced from WeightFormer.forward copy its annotations,
and TorchScript must read them as types (FX feature extraction, then torch.jit.script).
"""

from collections.abc import Sequence
from contextlib import nullcontext
from functools import partial

import torch
import torch.nn as nn
import torch.nn.functional as F
from timm.layers import DropPath, register_notrace_module, trunc_normal_
from timm.models import build_model_with_cfg, generate_default_cfgs, register_model
from timm.models._features import feature_take_indices
from torch.utils.checkpoint import checkpoint

from ..errors import UsageError
from ..layers import DynamicDWConv, DynamicLinear
from ..layers.dynamic import CONV_PREDICTORS, LINEAR_PREDICTORS, identity_tap, refill_after_load, refill_identity_tap
from ..layers.graph_capture import call_eagerly, is_fx_tracing
from ..layers.infsa_attention import check_choice
from ._cfg import hub_weights, model_cfg, require_weights
from ._chunking import TokenChunking, check_token_chunk, resolve_token_chunk, weightformer_features_chunked
from ._input import CheckedPatchEmbed

torch.fx.wrap("call_eagerly")  # one node per block in FX graphs (see layers.graph_capture.call_eagerly)

LayerNorm6 = partial(nn.LayerNorm, eps=1e-6)  # the release's LayerNorm


def _to_map(x: torch.Tensor, grid_size: tuple[int, int]) -> torch.Tensor:
    """(B, N, C) row-major tokens -> (B, C, H, W)."""
    return x.transpose(1, 2).reshape(x.shape[0], x.shape[2], *grid_size)


@register_notrace_module  # a leaf (one call_module node) in timm's FX feature extraction
class WeightFormerBlock(nn.Module):
    """Depthwise-conv token mixing plus MLP; the dynamic version predicts both layers' weights.

    dynamic:  x = LN1(x) (overwrites the residual stream); x = x + DynDWC(x); x = x + DropPath(MLP_dyn(LN2(x)))
    static:   x = x + DWConv3x3(x); x = x + DropPath(MLP(LN2(x)))
    """

    __constants__ = ["dynamic"]  # TorchScript compiles only the dynamic or the static branches of each block

    def __init__(
        self,
        dim: int,
        mlp_ratio: float = 4.0,
        dynamic: bool = False,
        drop: float = 0.0,
        drop_path: float = 0.0,
        norm_layer=LayerNorm6,
        act_layer=nn.GELU,
        linear_predictor: str = "bilateral",
        conv_predictor: str = "adaptive",
    ) -> None:
        super().__init__()
        hidden = int(dim * mlp_ratio)
        self.dynamic = dynamic
        if dynamic:
            self.norm1 = norm_layer(dim)
            self.linear1 = DynamicLinear(dim, hidden, predictor=linear_predictor)
            self.dwc = DynamicDWConv(dim, predictor=conv_predictor)
        else:
            self.linear1 = nn.Linear(dim, hidden)
            self.dwc = nn.Conv2d(dim, dim, kernel_size=3, padding=1, groups=dim)
            self.register_buffer("identity_tap", identity_tap(3), persistent=False)
            self.register_load_state_dict_post_hook(refill_after_load)
        self.norm2 = norm_layer(dim)
        self.act = act_layer()
        self.drop = nn.Dropout(drop)
        self.linear2 = nn.Linear(hidden, dim)
        self.drop_path = DropPath(drop_path) if drop_path > 0.0 else nn.Identity()

    def init_non_persistent_buffers(self) -> None:
        """Refill the static block's identity_tap (timm's protocol; the dynamic block's DynamicDWConv owns its own)."""
        if not self.dynamic:
            refill_identity_tap(self, 3, self.dwc.weight)

    def mlp(self, x: torch.Tensor, grid_size: tuple[int, int]) -> torch.Tensor:
        x = self.linear1(x, grid_size) if self.dynamic else self.linear1(x)
        return self.drop(self.linear2(self.drop(self.act(x))))

    def token_mixing(self, x: torch.Tensor, grid_size: tuple[int, int]) -> torch.Tensor:
        """x + DWConv(x) as one convolution: the residual is folded into the kernel's centre tap."""
        grid = _to_map(x, grid_size)  # a channels-last view, no copy
        if self.dynamic:
            out = self.dwc(grid, residual=True)
        else:
            conv = self.dwc
            kernel = conv.weight + self.identity_tap  # derived every call: never stale
            out = F.conv2d(grid, kernel, conv.bias, padding=conv.padding, groups=conv.groups)
        return out.flatten(2).transpose(1, 2)

    def forward(self, x: torch.Tensor, grid_size: tuple[int, int]) -> torch.Tensor:
        if is_fx_tracing() and not torch.jit.is_scripting():
            return call_eagerly(self, x, grid_size)
        if self.dynamic:
            x = self.norm1(x)
        x = self.token_mixing(x, grid_size)
        return x + self.drop_path(self.mlp(self.norm2(x), grid_size))

    @torch.no_grad()
    def forward_chunked(self, x: torch.Tensor, grid_size: tuple[int, int], band_rows: int) -> torch.Tensor:
        """Inference over row bands of ``band_rows`` (even) grid rows: norms and the MLP run band by band and
        update the residual stream in place; the 3x3 convolution sees the whole map (one N x C output).
        The dynamic MLP's weight comes from a first pass that pools normalised bands."""
        H, W = grid_size
        bands = [(r * W, min(H, r + band_rows) * W, (min(H, r + band_rows) - r, W)) for r in range(0, H, band_rows)]
        if self.dynamic:
            for s, e, _ in bands:
                x[:, s:e] = self.norm1(x[:, s:e])
        x = self.token_mixing(x, grid_size)
        if self.dynamic:
            weight = self.linear1.weight_of_bands((self.norm2(x[:, s:e]), g) for s, e, g in bands)
        for s, e, _ in bands:
            h = self.norm2(x[:, s:e])
            h = self.linear1.apply_weight(h, weight) if self.dynamic else self.linear1(h)
            x[:, s:e] += self.linear2(self.act(h))
        return x


class WeightFormer(nn.Module, TokenChunking):
    """WeightFormer backbone with timm's model API.

    Args:
        dynamic_interval: block i is dynamic iff (i + k - 1) % k == 0 (k = 3: blocks 1, 4, 7, ...);
            1 makes every block dynamic, 0 none (a static baseline).
        dynamic_blocks: explicit indices of dynamic blocks (overrides dynamic_interval).
        linear_predictor / conv_predictor: predictor families of the dynamic layers (ablations).
        check_finite: reject NaN/Inf inputs with a ValueError.
        token_chunk: at inference, norms and MLPs run over row bands of about this many tokens with the
            residual stream updated in place; "auto" (default) from 65,536 tokens on, None or 0 = off.
    """

    def __init__(
        self,
        img_size: int | tuple[int, int] = 224,
        patch_size: int = 16,
        in_chans: int = 3,
        num_classes: int = 1000,
        embed_dim: int = 384,
        depth: int = 17,
        mlp_ratio: float = 4.0,
        drop_rate: float = 0.0,
        drop_path_rate: float = 0.0,
        dynamic_interval: int = 3,
        dynamic_blocks: Sequence[int] | None = None,
        linear_predictor: str = "bilateral",
        conv_predictor: str = "adaptive",
        global_pool: str = "avg",
        dynamic_img_pad: bool = False,
        check_finite: bool = False,
        token_chunk: int | str | None = "auto",
    ) -> None:
        super().__init__()
        if global_pool not in ("avg", ""):
            raise UsageError(f"global_pool must be 'avg' or '', got {global_pool!r}")
        if dynamic_blocks is None:
            if dynamic_interval < 0:
                raise UsageError(f"dynamic_interval must be >= 0, got {dynamic_interval}")
            k = dynamic_interval
            dynamic_blocks = [i for i in range(depth) if k and (i + k - 1) % k == 0]
        self.dynamic_blocks = sorted(dynamic_blocks)
        check_choice("linear_predictor", linear_predictor, LINEAR_PREDICTORS)
        check_choice("conv_predictor", conv_predictor, CONV_PREDICTORS)
        check_token_chunk(token_chunk)
        self.num_classes = num_classes
        self.global_pool = global_pool
        self.num_features = self.head_hidden_size = self.embed_dim = embed_dim
        self.num_prefix_tokens = 0
        self.grad_checkpointing = False
        self.token_chunk = token_chunk
        self.patch_embed = CheckedPatchEmbed(
            img_size=img_size,
            patch_size=patch_size,
            in_chans=in_chans,
            embed_dim=embed_dim,
            flatten=True,
            strict_img_size=False,
            dynamic_img_pad=dynamic_img_pad,
        )
        self.patch_embed.check_finite = check_finite
        norm_layer = LayerNorm6
        self.init_norm = norm_layer(embed_dim)
        rates = torch.linspace(0, drop_path_rate, depth, device="cpu").tolist()  # also under a meta default device
        self.blocks = nn.ModuleList(
            WeightFormerBlock(
                embed_dim,
                mlp_ratio,
                dynamic=i in self.dynamic_blocks,
                drop=drop_rate,
                drop_path=rates[i],
                norm_layer=norm_layer,
                linear_predictor=linear_predictor,
                conv_predictor=conv_predictor,
            )
            for i in range(depth)
        )
        self.norm = norm_layer(embed_dim)
        self.head_drop = nn.Dropout(drop_rate)
        self.head = nn.Linear(embed_dim, num_classes) if num_classes > 0 else nn.Identity()
        self.feature_info = [dict(num_chs=embed_dim, reduction=patch_size, module=f"blocks.{i}") for i in range(depth)]
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(m: nn.Module) -> None:
        """trunc-normal(0.02)/zero bias for nn.Linear, ones/zeros for LayerNorm, default Conv2d (as released)."""
        if isinstance(m, nn.Linear):
            trunc_normal_(m.weight, std=0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.LayerNorm):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)

    # timm API ---------------------------------------------------------------------------------
    @torch.jit.ignore
    def no_weight_decay(self) -> set[str]:
        return set()

    @torch.jit.ignore
    def group_matcher(self, coarse: bool = False) -> dict:
        return dict(stem=r"^patch_embed|^init_norm", blocks=[(r"^blocks\.(\d+)", None), (r"^norm", (99999,))])

    @torch.jit.ignore
    def set_grad_checkpointing(self, enable: bool = True) -> None:
        self.grad_checkpointing = enable

    @torch.jit.ignore
    def get_classifier(self) -> nn.Module:
        return self.head

    def reset_classifier(self, num_classes: int, global_pool: str | None = None) -> None:
        self.num_classes = num_classes
        if global_pool is not None:
            self.global_pool = global_pool
        self.head = nn.Linear(self.embed_dim, num_classes) if num_classes > 0 else nn.Identity()

    def _embed(self, x: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int]]:
        grid_size = self.patch_embed.dynamic_feat_size((x.shape[-2], x.shape[-1]))
        return self.init_norm(self.patch_embed(x)), grid_size

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """(B, 3, H, W) -> normalised tokens (B, N, C); token-chunked at inference over many tokens."""
        x, grid_size = self._embed(x)
        if not torch.jit.is_scripting():
            chunk = resolve_token_chunk(self.token_chunk, x.shape[1])
            if chunk is not None:
                return weightformer_features_chunked(self, x, grid_size, chunk)
        every_block, keep_none = len(self.blocks), torch.jit.annotate(list[int], [])
        return self.norm(self._run_blocks(x, grid_size, every_block, keep_none, False, False)[0])

    def _run_blocks(
        self, x: torch.Tensor, grid_size: tuple[int, int], stop: int, keep: list[int], norm: bool, nchw: bool
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """The first ``stop`` blocks (grad-checkpointed when set, in training), and the outputs of the blocks in
        keep (normalised with ``norm``, as NCHW maps with ``nchw``). TorchScript takes no module as an argument,
        so forward_features and forward_intermediates share this loop rather than a per-block helper."""
        kept: list[torch.Tensor] = []
        for i, blk in enumerate(self.blocks):
            if i < stop:
                if self.grad_checkpointing and self.training and not torch.jit.is_scripting():
                    x = checkpoint(blk, x, grid_size, use_reentrant=False)
                else:
                    x = blk(x, grid_size)
                if i in keep:
                    y = self.norm(x) if norm else x
                    kept.append(_to_map(y, grid_size) if nchw else y)
        return x, kept

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        if self.global_pool == "avg":
            x = x.mean(dim=1)
        x = self.head_drop(x)
        return x if pre_logits else self.head(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_features(x))

    def forward_intermediates(
        self,
        x: torch.Tensor,
        indices: int | list[int] | None = None,
        norm: bool = False,
        stop_early: bool = False,
        output_fmt: str = "NCHW",
        intermediates_only: bool = False,
    ) -> list[torch.Tensor] | tuple[torch.Tensor, list[torch.Tensor]]:
        """Block outputs at ``indices`` (last n if int) as NCHW maps (or NLC tokens)."""
        if output_fmt not in ("NCHW", "NLC"):
            raise ValueError(f"output_fmt must be 'NCHW' or 'NLC', got {output_fmt!r}")
        take, max_index = feature_take_indices(len(self.blocks), indices)
        x, grid_size = self._embed(x)
        stop = max_index + 1 if stop_early else len(self.blocks)
        x, intermediates = self._run_blocks(x, grid_size, stop, take, norm, output_fmt == "NCHW")
        if intermediates_only:
            return intermediates
        return self.norm(x), intermediates

    def prune_intermediate_layers(
        self, indices: int | list[int] = 1, prune_norm: bool = False, prune_head: bool = True
    ) -> list[int]:
        take, max_index = feature_take_indices(len(self.blocks), indices)
        self.blocks = self.blocks[: max_index + 1]
        if prune_norm:
            self.norm = nn.Identity()
        if prune_head:
            self.reset_classifier(0, "")
        return take


def checkpoint_filter_fn(state_dict: dict, model: WeightFormer) -> dict:
    """Unwrap a released checkpoint ({'model': ...}, DDP 'module.' prefixes) and check it fits model.

    Raises ValueError naming missing, unexpected or mis-shaped tensors (a checkpoint of another family
    or width), so a wrong file never loads silently. Classifier shapes may differ (timm re-heads).
    """
    for key in ("model", "state_dict", "model_ema"):
        if isinstance(state_dict.get(key), dict):
            state_dict = state_dict[key]
            break
    state_dict = {k.removeprefix("module."): v for k, v in state_dict.items()}
    expected = model.state_dict()
    missing = sorted(set(expected) - set(state_dict))
    unexpected = sorted(set(state_dict) - set(expected))
    head = {"head.weight", "head.bias"}
    shapes = sorted(
        f"{k}: checkpoint {tuple(v.shape)} vs model {tuple(expected[k].shape)}"
        for k, v in state_dict.items()
        if k in expected and k not in head and tuple(v.shape) != tuple(expected[k].shape)
    )
    problems = [
        f"missing {len(missing)} keys (e.g. {missing[:3]})" if set(missing) - head else "",
        f"unexpected {len(unexpected)} keys (e.g. {unexpected[:3]})" if unexpected else "",
        f"shape mismatches: {shapes[:3]}" if shapes else "",
    ]
    problems = [p for p in problems if p]
    if problems:
        raise UsageError("checkpoint does not fit this WeightFormer: " + "; ".join(problems))
    return state_dict


def _cfg(variant: str, **kwargs) -> dict:
    """The release's evaluation (data/build.py): resize to a square of input / 0.875 (timm's "squash"), centre
    crop, bicubic, ImageNet mean / std; the weights from the Hub. (The Hub model card's snippet normalises with
    mean = std = 0.5, but the release trains and evaluates its weights with ImageNet's, so we follow the code.)"""
    return model_cfg(crop_pct=0.875, crop_mode="squash", paper_ids="arXiv:2605.01711", **hub_weights(variant), **kwargs)


default_cfgs = generate_default_cfgs(
    {
        "weightformer_tiny_patch16_224": _cfg("weightformer_tiny_patch16_224"),
        "weightformer_small_patch16_224": _cfg("weightformer_small_patch16_224"),
        "weightformer_base_patch16_448": _cfg("weightformer_base_patch16_448", input_size=(3, 448, 448)),
    }
)


def _create(variant: str, pretrained: bool = False, **kwargs) -> WeightFormer:
    """timm's builder; ``device`` and ``dtype`` as timm's own models take them (create_model(..., device="meta"))."""
    require_weights(variant, pretrained, kwargs)
    device, dtype = kwargs.pop("device", None), kwargs.pop("dtype", None)
    with torch.device(device) if device is not None else nullcontext():
        model = build_model_with_cfg(
            WeightFormer,
            variant,
            pretrained,
            pretrained_filter_fn=checkpoint_filter_fn,
            feature_cfg=dict(out_indices=kwargs.pop("out_indices", 3), feature_cls="getter"),
            **kwargs,
        )
    return model if dtype is None else model.to(dtype)


@register_model
def weightformer_tiny_patch16_224(pretrained: bool = False, **kwargs) -> WeightFormer:
    """WeightFormer-T: width 192, 17 blocks (7.07M params)."""
    return _create("weightformer_tiny_patch16_224", pretrained, **dict(dict(embed_dim=192, depth=17), **kwargs))


@register_model
def weightformer_small_patch16_224(pretrained: bool = False, **kwargs) -> WeightFormer:
    """WeightFormer-S: width 384, 17 blocks, drop path 0.2 in the paper's recipe."""
    return _create("weightformer_small_patch16_224", pretrained, **dict(dict(embed_dim=384, depth=17), **kwargs))


@register_model
def weightformer_base_patch16_448(pretrained: bool = False, **kwargs) -> WeightFormer:
    """WeightFormer-B: WeightFormer-S's shape at 448x448 input (784 tokens)."""
    model_args = dict(img_size=448, embed_dim=384, depth=17)
    return _create("weightformer_base_patch16_448", pretrained, **dict(model_args, **kwargs))
