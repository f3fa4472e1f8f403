"""Effective receptive field (RepLKNet protocol): how far the centre output location sees into the input.

For each image: gradient of the sum of the centre token's output features (last block, final norm)
with respect to the input, ReLU, summed over channels; averaged over images. Reported: the heat map
(x^0.2 then / max, for display) and the share of gradient mass outside the central quarter of the image
(the middle half of each side), computed on the raw averaged map.
"""

from __future__ import annotations

import torch
import torch.nn as nn


def _tokens(model: nn.Module, images: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int]]:
    feats = model.forward_features(images)
    h, w = model.patch_embed.dynamic_feat_size(images.shape[-2:])
    prefix = int(getattr(model, "num_prefix_tokens", 0))
    return feats[:, prefix:], (h, w)


def effective_receptive_field(model: nn.Module, images: torch.Tensor) -> dict:
    """Returns {"map": (H, W) raw mean gradient, "display": x^0.2 / max, "outside_center_share": float}."""
    was_training = model.training
    model.eval()
    total = None
    try:
        for image in images:
            x = image[None].clone().requires_grad_(True)
            tokens, (h, w) = _tokens(model, x)
            centre = (h // 2) * w + (w // 2)
            tokens[0, centre].sum().backward()
            contribution = torch.relu(x.grad[0]).sum(0)
            total = contribution if total is None else total + contribution
    finally:
        model.train(was_training)
    grad = (total / len(images)).detach()
    H, W = grad.shape
    inside = grad[H // 4 : H - H // 4, W // 4 : W - W // 4].sum()
    share = float(1.0 - inside / grad.sum().clamp_min(1e-30))
    display = grad.pow(0.2)
    display = display / display.max().clamp_min(1e-30)
    return {"map": grad, "display": display, "outside_center_share": share}
