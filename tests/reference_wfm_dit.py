"""An independent WeightFormer-DiT written from the release's model/wfm_dit.py, in its style.

Square grids only (the release's int(N ** 0.5)), the release's module layout and parameter names and its
operation order (the residual stream is norm1(x); DynLinear divides its pooled sum by N; DynCnn pools to
3 x 3). A state dict saved from this module has the release's layout, and its outputs are the reference.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from timm.layers import PatchEmbed


def modulate(x, shift, scale):
    return x * (1 + scale.unsqueeze(1)) + shift.unsqueeze(1)


class RefTimestep(nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(256, hidden), nn.SiLU(), nn.Linear(hidden, hidden))

    def forward(self, t):
        half = 128
        freqs = torch.exp(-math.log(10000) * torch.arange(0, half, dtype=torch.float32) / half)
        args = t[:, None].float() * freqs[None]
        return self.mlp(torch.cat([torch.cos(args), torch.sin(args)], dim=-1))


class RefLabel(nn.Module):
    def __init__(self, num_classes, hidden):
        super().__init__()
        self.embedding_table = nn.Embedding(num_classes + 1, hidden)

    def forward(self, labels):
        return self.embedding_table(labels)


class RefDynLinear(nn.Module):
    def __init__(self, cin, cout):
        super().__init__()
        self.scale, self.rate, self.cin, self.cout = cin**-0.5, 4, cin, cout
        self.w = nn.Parameter(torch.randn(cin, cout) * 0.02)
        self.b = nn.Parameter(torch.randn(cout) * 0.02)
        self.wfm = nn.Linear(cin, cin // 4 + cout // 4)
        self.w1 = nn.Parameter(torch.randn(cin // 4, cin) * 0.02)
        self.w2 = nn.Parameter(torch.randn(cout // 4, cout) * 0.02)
        self.pool = nn.AvgPool2d(2)

    def forward(self, x):
        B, N, C = x.shape
        side = int(N**0.5)
        pooled = self.pool(x.transpose(1, 2).reshape(B, C, side, side)).flatten(2).transpose(1, 2)
        w1, w2 = torch.split(self.wfm(pooled), [self.cin // 4, self.cout // 4], dim=-1)
        w = (F.silu(w1) @ self.w1).transpose(-2, -1) @ (F.silu(w2) @ self.w2) * self.scale / N
        w = w / (w.norm(dim=-2, keepdim=True) + 1.0) + self.w
        return x @ w + self.b


class RefDynCnn(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.w = nn.Parameter(torch.randn(dim, 1, 3, 3) * 0.02)
        self.b = nn.Parameter(torch.randn(dim) * 0.02)
        self.pool = nn.AdaptiveAvgPool2d(3)
        self.wfm = nn.Sequential(nn.Conv2d(dim, dim, 1), nn.GELU(), nn.Conv2d(dim, dim, 1, bias=False))

    def forward(self, x):
        B, C, H, W = x.shape
        w = self.wfm(self.pool(x)).reshape(B * C, 1, 3, 3)
        w = w / (w.norm(dim=(-2, -1), keepdim=True) + 1.0) + self.w.repeat(B, 1, 1, 1)
        return F.conv2d(x.reshape(1, B * C, H, W), w, self.b.repeat(B), padding=1, groups=B * C).reshape(B, C, H, W)


class RefBlock(nn.Module):
    def __init__(self, hidden, layer):
        super().__init__()
        self.norm1 = nn.LayerNorm(hidden, elementwise_affine=False, eps=1e-6)
        self.norm2 = nn.LayerNorm(hidden, elementwise_affine=False, eps=1e-6)
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(hidden, 6 * hidden))
        if (layer + 2) % 3 == 0:
            self.linear1, self.dwc = RefDynLinear(hidden, 4 * hidden), RefDynCnn(hidden)
        else:
            self.linear1 = nn.Linear(hidden, 4 * hidden)
            self.dwc = nn.Conv2d(hidden, hidden, 3, padding=1, groups=hidden)
        self.linear2 = nn.Linear(4 * hidden, hidden)

    def forward(self, x, c):
        s1, sc1, g1, s2, sc2, g2 = self.adaLN_modulation(c).chunk(6, dim=1)
        B, N, C = x.shape
        side = int(N**0.5)
        x = self.norm1(x)
        mixed = self.dwc(modulate(x, s1, sc1).reshape(B, side, side, C).permute(0, 3, 1, 2)).flatten(2).permute(0, 2, 1)
        x = x + g1.unsqueeze(1) * mixed
        h = self.linear2(nn.GELU(approximate="tanh")(self.linear1(modulate(self.norm2(x), s2, sc2))))
        return x + g2.unsqueeze(1) * h


class RefFinal(nn.Module):
    def __init__(self, hidden, patch, out_channels):
        super().__init__()
        self.norm_final = nn.LayerNorm(hidden, elementwise_affine=False, eps=1e-6)
        self.linear = nn.Linear(hidden, patch * patch * out_channels)
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(hidden, 2 * hidden))

    def forward(self, x, c):
        shift, scale = self.adaLN_modulation(c).chunk(2, dim=1)
        return self.linear(modulate(self.norm_final(x), shift, scale))


def ref_pos_embed(dim, side):
    def one_d(d, pos):
        omega = 1.0 / 10000 ** (np.arange(d // 2, dtype=np.float64) / (d / 2.0))
        out = np.einsum("m,d->md", pos.reshape(-1), omega)
        return np.concatenate([np.sin(out), np.cos(out)], axis=1)

    grid = np.stack(np.meshgrid(np.arange(side, dtype=np.float32), np.arange(side, dtype=np.float32)), axis=0)
    return np.concatenate([one_d(dim // 2, grid[0]), one_d(dim // 2, grid[1])], axis=1)


class RefWFMDiT(nn.Module):
    def __init__(self, input_size=16, patch_size=2, in_channels=4, hidden_size=64, depth=3, num_classes=10):
        super().__init__()
        self.out_channels, self.patch = in_channels * 2, patch_size
        self.x_embedder = PatchEmbed(input_size, patch_size, in_channels, hidden_size, bias=True)
        self.t_embedder = RefTimestep(hidden_size)
        self.y_embedder = RefLabel(num_classes, hidden_size)
        side = input_size // patch_size
        self.pos_embed = nn.Parameter(
            torch.from_numpy(ref_pos_embed(hidden_size, side)).float()[None], requires_grad=False
        )
        self.blocks = nn.ModuleList([RefBlock(hidden_size, i) for i in range(depth)])
        self.final_layer = RefFinal(hidden_size, patch_size, self.out_channels)

    def forward(self, x, t, y):
        x = self.x_embedder(x) + self.pos_embed
        c = self.t_embedder(t) + self.y_embedder(y)
        for block in self.blocks:
            x = block(x, c)
        x = self.final_layer(x, c)
        p, c_out, side = self.patch, self.out_channels, int(x.shape[1] ** 0.5)
        x = torch.einsum("nhwpqc->nchpwq", x.reshape(x.shape[0], side, side, p, p, c_out))
        return x.reshape(x.shape[0], c_out, side * p, side * p)
