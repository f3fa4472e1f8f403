"""Straightforward float64 references, written from the spec with no shared code from linvit."""

from __future__ import annotations

import torch


def _gamma(gamma, H):
    g = torch.as_tensor(gamma, dtype=torch.float64)
    return g.reshape(1, -1, 1, 1).expand(1, H, 1, 1) if g.dim() else g.reshape(1, 1, 1, 1).expand(1, H, 1, 1)


def pure_infsa_ref(q, k, v, gamma, eps=1e-6):
    """Dense A^ per (b, h) in float64 (spec/infsa.md section 2)."""
    q, k, v = q.double(), k.double(), v.double()
    D = q.shape[-1]
    A = torch.relu(q @ k.transpose(-2, -1) / D)
    norm = torch.sqrt((A**2).sum(dim=(-2, -1), keepdim=True))
    return _gamma(gamma, q.shape[1]) * (A / (norm + eps)) @ v


def pure_infsa_release(q, k, v, rho, eps=1e-6):
    """The reference release's operations in its order (flatten, torch.norm, rho * A, matmul)."""
    D = q.shape[-1]
    scale = (1.0 / D) ** 0.5
    A = torch.relu((q * scale) @ (k * scale).transpose(-2, -1))
    shape = A.shape
    flat = A.flatten(-2)
    A = (flat / (torch.norm(flat, p=2, dim=-1, keepdim=True) + eps)).view(shape)
    return (rho * A) @ v


def linear_infsa_ref(q, k, v, gamma, eps=1e-6):
    """Spec section 3 step by step with Python-level clarity, float64."""
    q, k, v = q.double(), k.double(), v.double()
    D = q.shape[-1]
    qs, ks = q / D**0.5, k / D**0.5
    e = qs.norm(dim=-1)  # (B, H, N)
    alpha = e / (e.sum(-1, keepdim=True) + eps)
    q_bar = (alpha[..., None] * qs).sum(-2)  # (B, H, D)
    a = torch.relu((ks * q_bar[:, :, None, :]).sum(-1))
    a = a / (a.sum(-1, keepdim=True) + eps)
    z = _gamma(gamma, q.shape[1])[..., 0] * (a[..., None] * v).sum(-2)  # (B, H, D)
    return z[:, :, None, :].expand_as(v)
