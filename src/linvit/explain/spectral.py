"""Spectral fidelity of InfSA layers: does Linear-InfSA's importance track the operator's Perron vector?

For every InfSA layer and head, on given images, from the layer's own q and k:
- cosine between Linear-InfSA's importance vector a (one power-iteration step from the soft query)
  and the left Perron vector of the full A^ = ReLU(q k^T / d) / (||.||_F + eps) (power iteration, float64);
- the spectral radius of gamma * A^ (below 1 guarantees the Neumann series converges), from the Perron root;
- the relative gap ||S_L - K||_F / ||K||_F between the depth-L truncated series S_L = sum_{t=1..L} (gamma A^)^t
  (what L stacked one-hop layers can express for a fixed A^) and the exact Katz kernel K = (I - gamma A^)^{-1} - I.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..layers import KatzInfSAAttention
from ..ops import infsa_operator, katz_kernel, linear_infsa_importance, perron_vector_dense
from .maps import attention_mixers, capture_inputs, projected_qk


@torch.no_grad()
def spectral_report(model: nn.Module, images: torch.Tensor, depth: int | None = None) -> dict:
    """Per-layer, per-head fidelity numbers (averaged over images) and their means over layers and heads."""
    was_training = model.training
    model.eval()
    try:
        mixers = attention_mixers(model, "katz")
        inputs, _ = capture_inputs(model, mixers, images)
    finally:
        model.train(was_training)
    depth = depth or len(mixers)
    layers = []
    for index, (mixer, x) in enumerate(zip(mixers, inputs, strict=True)):
        q, k = projected_qk(mixer, x, features=False)  # the projections themselves, before any learned map
        A = infsa_operator(q, k, mixer.eps)  # the ReLU(q k^T / d) operator, for Katz layers too (see note)
        perron = perron_vector_dense(A)
        importance = linear_infsa_importance(q, k, mixer.eps, getattr(mixer, "linear_variant", "release"))  # its own
        cosine = F.cosine_similarity(importance, perron, dim=-1)  # (B, H)
        gamma = mixer.gamma.double().reshape(1, -1, 1, 1)
        GA = gamma * A
        # A^ >= 0, so its spectral radius is its Perron root: v^T A^ = rho v^T with sum(v) = 1 gives
        # rho = sum(v^T A^); robust where eigvals fails on (near-)singular score matrices
        radius = gamma[..., 0, 0] * (perron[..., None, :] @ A)[..., 0, :].sum(-1)
        kernel = katz_kernel(A, mixer.gamma.double())
        series, power = torch.zeros_like(GA), torch.eye(A.shape[-1], dtype=A.dtype).expand_as(GA)
        for _ in range(depth):
            power = power @ GA
            series = series + power
        gap = torch.linalg.matrix_norm(series - kernel) / torch.linalg.matrix_norm(kernel).clamp_min(1e-300)
        layers.append(
            {
                "layer": index,
                "mixer": type(mixer).__name__,
                "cosine": cosine.mean(0).tolist(),
                "spectral_radius": radius.mean(0).tolist(),
                "truncation_gap": gap.mean(0).tolist(),
                "gamma": mixer.gamma.tolist(),
            }
        )
    mean = {
        key: float(torch.tensor([v for lay in layers for v in lay[key]]).mean())
        for key in ("cosine", "spectral_radius", "truncation_gap")
    }
    note = "Katz-InfSA layers: cosine and radius use the ReLU(q k^T / d) operator of the same q, k"
    return {
        "layers": layers,
        "mean": mean,
        "depth": depth,
        "images": int(images.shape[0]),
        "note": note if any(isinstance(m, KatzInfSAAttention) for m in mixers) else None,
    }


__all__ = ["spectral_report"]
