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


def katz_dense_ref(q, k, v, gamma, eps=1e-6, kind="relu"):
    """((I - gamma A^)^{-1} - I) V with A^ the Frobenius-normalised phi(Q) phi(K)^T, dense float64."""
    A_hat = _katz_a_hat(q, k, eps, kind)
    N = A_hat.shape[-1]
    g = _gamma(gamma, q.shape[1])
    eye = torch.eye(N, dtype=torch.float64)
    return (torch.linalg.inv(eye - g * A_hat) - eye) @ v.double()


def katz_centrality_dense_ref(q, k, gamma, eps=1e-6):
    A_hat = _katz_a_hat(q, k, eps, "relu")
    N = A_hat.shape[-1]
    eye = torch.eye(N, dtype=torch.float64)
    kernel = torch.linalg.inv(eye - _gamma(gamma, q.shape[1]) * A_hat) - eye
    return kernel.transpose(-2, -1).sum(-1)


def _katz_a_hat(q, k, eps, kind):
    D = q.shape[-1]
    phi = (lambda t: torch.relu(t)) if kind == "relu" else (lambda t: torch.nn.functional.elu(t) + 1)
    A = phi(q.double() / D**0.5) @ phi(k.double() / D**0.5).transpose(-2, -1)
    return A / (torch.sqrt((A**2).sum(dim=(-2, -1), keepdim=True)) + eps)


def left_perron_numpy(A_hat):
    """Principal left eigenvector of a non-negative matrix via numpy's eigendecomposition, L1-normalised."""
    import numpy as np

    vals, vecs = np.linalg.eig(A_hat.T)
    vec = np.abs(np.real(vecs[:, np.argmax(np.real(vals))]))
    return vec / vec.sum()


def causal_katz_series_ref(q, k, v, gamma, eps=1e-6, kind="elu+1", tol=1e-15):
    """sum_{t>=1} gamma^t A^t V summed term by term (dense float64) for the causal, row-normalised operator
    A_ij = phi(q_i) . phi(k_j) / (phi(q_i) . sum_{l<=i} phi(k_l) + eps), j <= i: no solve, no recurrence."""
    D = q.shape[-1]
    phi = (lambda t: torch.relu(t)) if kind == "relu" else (lambda t: torch.nn.functional.elu(t) + 1)
    scores = torch.tril(phi(q.double() / D**0.5) @ phi(k.double() / D**0.5).transpose(-2, -1))
    A = _gamma(gamma, q.shape[1]) * scores / (scores.sum(-1, keepdim=True) + eps)
    term, total = v.double(), torch.zeros_like(v, dtype=torch.float64)
    while True:  # ||gamma A||_inf <= max gamma < 1: the terms shrink geometrically
        term = A @ term
        total = total + term
        if term.abs().max() <= tol * max(total.abs().max().item(), 1.0):
            return total
