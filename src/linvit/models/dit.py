"""Diffusion transformers (DiT) with a choice of token mixer, for class-conditional image generation.

DiT (Peebles & Xie 2023): patchify a latent (or image), add fixed 2-D sin-cos positions, condition every
block on timestep + class embeddings through adaLN-Zero, predict noise (and variance with learn_sigma). The
mixer is softmax attention (timm's fused attention, the baseline), pure, Linear or Katz InfSA (the InfViT
family's layers), or WeightFormer's dynamic-weight block, which is state-dict compatible with the
WeightFormer release's model/wfm_dit.py (same parameter names and shapes, the same outputs). Any grid the
patch divides works: positions are computed for the grid at hand (the stored table serves its own size).
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
import torch
import torch.nn as nn
from timm.layers import PatchEmbed

from ..errors import UsageError
from ..mixers import get_mixer, list_mixers
from .dit_blocks import AttentionDiTBlock, WeightFormerDiTBlock, modulate

# size: (hidden, depth, heads); DiT's table plus a tiny one for CPUs. WeightFormer blocks have no attention
# and fewer parameters, so the release stacks 15 where DiT-S/B stack 12; L and XL scale the same way (ours).
SIZES = {"tiny": (128, 4, 4), "S": (384, 12, 6), "B": (768, 12, 12), "L": (1024, 24, 16), "XL": (1152, 28, 16)}
WEIGHTFORMER_DEPTH = {"tiny": 5, "S": 15, "B": 15, "L": 30, "XL": 35}


def dit_mixers() -> tuple[str, ...]:
    """The mixers a DiT takes: every registered one (linvit.mixers) and WeightFormer's dynamic-weight block."""
    return (*list_mixers(), "weightformer")


def __getattr__(name: str):
    """``MIXERS``: dit_mixers() as the registry is now (kept for its readers)."""
    if name == "MIXERS":
        return dit_mixers()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class TimestepEmbedder(nn.Module):
    """Sinusoidal timestep features -> MLP (DiT's; names mlp.0 / mlp.2)."""

    def __init__(self, hidden_size: int, frequency_embedding_size: int = 256) -> None:
        super().__init__()
        self.mlp = nn.Sequential(
            nn.Linear(frequency_embedding_size, hidden_size), nn.SiLU(), nn.Linear(hidden_size, hidden_size)
        )
        self.frequency_embedding_size = frequency_embedding_size

    @staticmethod
    def timestep_embedding(t: torch.Tensor, dim: int, max_period: int = 10000) -> torch.Tensor:
        half = dim // 2
        freqs = torch.exp(-math.log(max_period) * torch.arange(half, dtype=torch.float32, device=t.device) / half)
        args = t[:, None].float() * freqs[None]
        embedding = torch.cat([torch.cos(args), torch.sin(args)], dim=-1)
        return torch.cat([embedding, torch.zeros_like(embedding[:, :1])], dim=-1) if dim % 2 else embedding

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        return self.mlp(self.timestep_embedding(t, self.frequency_embedding_size).to(self.mlp[0].weight.dtype))


class LabelEmbedder(nn.Module):
    """Class embeddings with one extra "no class" row for classifier-free guidance (label dropout in training)."""

    def __init__(self, num_classes: int, hidden_size: int, dropout_prob: float) -> None:
        super().__init__()
        self.embedding_table = nn.Embedding(num_classes + int(dropout_prob > 0), hidden_size)
        self.num_classes, self.dropout_prob = num_classes, dropout_prob

    def forward(self, labels: torch.Tensor, train: bool, force_drop_ids: torch.Tensor | None = None) -> torch.Tensor:
        if (train and self.dropout_prob > 0) or force_drop_ids is not None:
            drop = (
                force_drop_ids == 1
                if force_drop_ids is not None
                else torch.rand(labels.shape[0], device=labels.device) < self.dropout_prob
            )
            labels = torch.where(drop, self.num_classes, labels)
        return self.embedding_table(labels)


class FinalLayer(nn.Module):
    def __init__(self, hidden_size: int, patch_size: int, out_channels: int) -> None:
        super().__init__()
        self.norm_final = nn.LayerNorm(hidden_size, elementwise_affine=False, eps=1e-6)
        self.linear = nn.Linear(hidden_size, patch_size * patch_size * out_channels)
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(hidden_size, 2 * hidden_size))

    def forward(self, x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        shift, scale = self.adaLN_modulation(c).chunk(2, dim=1)
        return self.linear(modulate(self.norm_final(x), shift, scale))


@lru_cache(maxsize=16)
def sincos_positions(dim: int, grid_h: int, grid_w: int) -> np.ndarray:
    """MAE's fixed 2-D sin-cos table for an H x W grid, (H*W, dim): half for rows, half for columns.

    A pure function of its arguments (never of weights), so memoising it cannot go stale.
    """
    if dim % 4:
        raise UsageError(f"sin-cos positions need a hidden size divisible by 4, got {dim}")
    omega = 1.0 / 10000 ** (np.arange(dim // 4, dtype=np.float64) / (dim / 4.0))
    cols, rows = np.meshgrid(np.arange(grid_w, dtype=np.float32), np.arange(grid_h, dtype=np.float32))

    def encode(pos: np.ndarray) -> np.ndarray:
        out = np.einsum("m,d->md", pos.reshape(-1), omega)
        return np.concatenate([np.sin(out), np.cos(out)], axis=1)

    table = np.concatenate([encode(cols), encode(rows)], axis=1)  # the release: grid[0] is w, encoded first
    table.setflags(write=False)
    return table


class DiT(nn.Module):
    """Diffusion transformer: forward(x, t, y) -> noise (and variance) prediction of x's shape (x2 channels
    with learn_sigma).

    Args:
        input_size: side of the latent the position table is stored for (others work too).
        patch_size, in_channels, hidden_size, depth, num_heads, mlp_ratio: DiT's.
        class_dropout_prob: label dropout for classifier-free guidance.
        num_classes: classes of the conditioning labels.
        learn_sigma: also predict the variance (out_channels = 2 * in_channels).
        mixer: a registered mixer ("softmax", "pure_infsa", "linear_infsa", "katz_infsa", ...; the old "pure",
            "linear", "katz" still work) or "weightformer".
    """

    def __init__(
        self,
        input_size: int = 32,
        patch_size: int = 2,
        in_channels: int = 4,
        hidden_size: int = 1152,
        depth: int = 28,
        num_heads: int = 16,
        mlp_ratio: float = 4.0,
        class_dropout_prob: float = 0.1,
        num_classes: int = 1000,
        learn_sigma: bool = True,
        mixer: str = "softmax",
    ) -> None:
        super().__init__()
        if mixer != "weightformer":
            try:
                record = get_mixer(mixer)  # an earlier spelling ("linear") with a DeprecationWarning
            except UsageError:
                raise UsageError(f"unknown mixer {mixer!r}; choose from {', '.join(dit_mixers())}") from None
            layer, mixer = record.cls, record.name
        self.mixer, self.learn_sigma, self.in_channels = mixer, learn_sigma, in_channels
        self.out_channels = in_channels * 2 if learn_sigma else in_channels
        self.patch_size = patch_size
        self.x_embedder = PatchEmbed(input_size, patch_size, in_channels, hidden_size, bias=True, strict_img_size=False)
        self.t_embedder = TimestepEmbedder(hidden_size)
        self.y_embedder = LabelEmbedder(num_classes, hidden_size, class_dropout_prob)
        self.pos_embed = nn.Parameter(torch.zeros(1, self.x_embedder.num_patches, hidden_size), requires_grad=False)
        if mixer == "weightformer":
            blocks = [WeightFormerDiTBlock(hidden_size, mlp_ratio, layer=i) for i in range(depth)]
        else:
            blocks = [AttentionDiTBlock(hidden_size, num_heads, layer, mlp_ratio) for _ in range(depth)]
        self.blocks = nn.ModuleList(blocks)
        self.final_layer = FinalLayer(hidden_size, patch_size, self.out_channels)
        self.initialize_weights()

    def initialize_weights(self) -> None:
        """DiT's initialisation: xavier linears, fixed positions, adaLN modulation and output zeroed."""

        def basic(module: nn.Module) -> None:
            if isinstance(module, nn.Linear):
                nn.init.xavier_uniform_(module.weight)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)

        self.apply(basic)  # linear layers only: InfSA discounts keep their own start
        grid = self.x_embedder.grid_size
        with torch.no_grad():
            self.pos_embed.copy_(torch.tensor(sincos_positions(self.pos_embed.shape[-1], *grid)).float()[None])
        w = self.x_embedder.proj.weight.data
        nn.init.xavier_uniform_(w.view([w.shape[0], -1]))
        nn.init.zeros_(self.x_embedder.proj.bias)
        nn.init.normal_(self.y_embedder.embedding_table.weight, std=0.02)
        nn.init.normal_(self.t_embedder.mlp[0].weight, std=0.02)
        nn.init.normal_(self.t_embedder.mlp[2].weight, std=0.02)
        for modulation in [b.adaLN_modulation[-1] for b in self.blocks] + [self.final_layer.adaLN_modulation[-1]]:
            nn.init.zeros_(modulation.weight)
            nn.init.zeros_(modulation.bias)
        nn.init.zeros_(self.final_layer.linear.weight)
        nn.init.zeros_(self.final_layer.linear.bias)

    def positions(self, grid: tuple[int, int], like: torch.Tensor) -> torch.Tensor:
        """The stored table at its own grid (as a checkpoint holds it), the sin-cos table at any other."""
        if tuple(grid) == tuple(self.x_embedder.grid_size):
            return self.pos_embed.to(like.dtype)
        return torch.tensor(sincos_positions(self.pos_embed.shape[-1], *grid)).to(like)[None]

    def grid_of(self, x: torch.Tensor) -> tuple[int, int]:
        H, W = x.shape[-2:]
        p = self.patch_size
        if H % p or W % p:
            raise UsageError(f"input {H}x{W} is not a multiple of the patch size {p}")
        return H // p, W // p

    def unpatchify(self, x: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
        """(B, h*w, p*p*C) -> (B, C, h*p, w*p)."""
        (h, w), p, c = grid, self.patch_size, self.out_channels
        x = torch.einsum("nhwpqc->nchpwq", x.reshape(x.shape[0], h, w, p, p, c))
        return x.reshape(x.shape[0], c, h * p, w * p)

    def forward(self, x: torch.Tensor, t: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        grid = self.grid_of(x)
        tokens = self.x_embedder(x)
        tokens = tokens + self.positions(grid, tokens)
        c = self.t_embedder(t) + self.y_embedder(y, self.training)
        for block in self.blocks:
            tokens = block(tokens, c, grid)
        return self.unpatchify(self.final_layer(tokens, c), grid)

    def forward_with_cfg(self, x: torch.Tensor, t: torch.Tensor, y: torch.Tensor, cfg_scale: float) -> torch.Tensor:
        """Classifier-free guidance on a batch whose second half carries the "no class" label: the noise
        prediction of all in_channels channels is guided (DiT's release guides 3 of its 4 latent channels)."""
        half = x[: len(x) // 2]
        out = self.forward(torch.cat([half, half]), t, y)
        eps, rest = out[:, : self.in_channels], out[:, self.in_channels :]
        cond, uncond = eps.chunk(2)
        guided = uncond + cfg_scale * (cond - uncond)
        return torch.cat([torch.cat([guided, guided]), rest], dim=1)


def create_dit(size: str = "tiny", mixer: str = "softmax", **kwargs) -> DiT:
    """DiT-{tiny,S,B,L,XL} with a mixer; WeightFormer takes the release's deeper stack of its own blocks."""
    if size not in SIZES:
        raise UsageError(f"unknown DiT size {size!r}; choose from {', '.join(SIZES)}")
    hidden, depth, heads = SIZES[size]
    if mixer == "weightformer":
        depth = WEIGHTFORMER_DEPTH[size]
    return DiT(**{"hidden_size": hidden, "depth": depth, "num_heads": heads, "mixer": mixer, **kwargs})
