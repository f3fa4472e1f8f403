"""An independent WeightFormer written from spec/weightformer.md in the release's style.

Square grids only (the release's int(N ** 0.5)), nn.Sequential blocks and the release's parameter
names: a checkpoint saved from this module has the official layout, and its logits are the reference.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


class RefDynLinear(nn.Module):
    def __init__(self, cin, cout):
        super().__init__()
        self.cin, self.cout = cin, cout
        self.w = nn.Parameter(torch.randn(cin, cout) * 0.02)
        self.b = nn.Parameter(torch.randn(cout) * 0.02)
        self.wfm = nn.Linear(cin, cin // 4 + cout // 4)
        self.w1 = nn.Parameter(torch.randn(cin // 4, cin) * 0.02)
        self.w2 = nn.Parameter(torch.randn(cout // 4, cout) * 0.02)

    def forward(self, x):
        B, N, C = x.shape
        s = int(N**0.5)
        pooled = F.avg_pool2d(x.permute(0, 2, 1).reshape(B, C, s, s), 2).reshape(B, C, -1).permute(0, 2, 1)
        z = self.wfm(pooled)
        p = F.silu(z[..., : self.cin // 4]) @ self.w1
        r = F.silu(z[..., self.cin // 4 :]) @ self.w2
        dw = p.permute(0, 2, 1) @ r / (self.cin**0.5 * N)
        dw = dw / (dw.pow(2).sum(dim=1, keepdim=True).sqrt() + 1)
        return x @ (self.w + dw) + self.b


class RefDynConv(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.w = nn.Parameter(torch.randn(c, 1, 3, 3) * 0.02)
        self.b = nn.Parameter(torch.randn(c) * 0.02)
        self.wfm = nn.Sequential(nn.Conv2d(c, c, 1), nn.GELU(), nn.Conv2d(c, c, 1, bias=False))

    def forward(self, x):
        outs = []
        for xi in x:  # one sample at a time: the straightforward definition
            dk = self.wfm(F.adaptive_avg_pool2d(xi[None], 3))[0]  # (C, 3, 3)
            dk = dk / (dk.pow(2).sum(dim=(1, 2), keepdim=True).sqrt() + 1)
            kernel = self.w + dk[:, None]
            outs.append(F.conv2d(xi[None], kernel, self.b, padding=1, groups=xi.shape[0]))
        return torch.cat(outs)


class RefBlock(nn.Module):
    def __init__(self, c, i):
        super().__init__()
        self.is_dyn = (i + 2) % 3 == 0
        self.norm2 = nn.LayerNorm(c, eps=1e-6)
        self.linear2 = nn.Linear(4 * c, c)
        if self.is_dyn:
            self.norm1 = nn.LayerNorm(c, eps=1e-6)
            self.linear1 = RefDynLinear(c, 4 * c)
            self.dwc = RefDynConv(c)
        else:
            self.linear1 = nn.Linear(c, 4 * c)
            self.dwc = nn.Conv2d(c, c, 3, padding=1, groups=c)

    def forward(self, x):
        B, N, C = x.shape
        s = int(N**0.5)
        if self.is_dyn:
            x = self.norm1(x)
        x = x + self.dwc(x.reshape(B, s, s, C).permute(0, 3, 1, 2)).flatten(2).permute(0, 2, 1)
        return x + self.linear2(F.gelu(self.linear1(self.norm2(x))))


class RefWeightFormer(nn.Module):
    def __init__(self, embed_dim=192, depth=17, num_classes=1000, patch=16):
        super().__init__()
        self.patch_embed = nn.Module()
        self.patch_embed.proj = nn.Conv2d(3, embed_dim, patch, patch)
        self.init_norm = nn.LayerNorm(embed_dim, eps=1e-6)
        self.blocks = nn.Sequential(*[RefBlock(embed_dim, i) for i in range(depth)])
        self.norm = nn.LayerNorm(embed_dim, eps=1e-6)
        self.head = nn.Linear(embed_dim, num_classes)
        with torch.no_grad():  # non-trivial LayerNorm affine parameters exercise every tensor
            for m in self.modules():
                if isinstance(m, nn.LayerNorm):
                    m.weight.normal_(1.0, 0.1)
                    m.bias.normal_(0.0, 0.1)

    def forward(self, x):
        x = self.init_norm(self.patch_embed.proj(x).flatten(2).transpose(1, 2))
        return self.head(self.norm(self.blocks(x)).mean(1))
