"""Shared fixtures and float64 reference implementations used across the test-suite."""

from __future__ import annotations

import os

import pytest
import torch
from hypothesis import settings

settings.register_profile("linvit", deadline=None, max_examples=25, derandomize=True)
settings.load_profile("linvit")

# one thread per pytest-xdist worker (the README's `-n 2` runs two on a 2-core machine), two otherwise
torch.set_num_threads(1 if os.environ.get("PYTEST_XDIST_WORKER") else 2)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| / max |b| (0 when both vanish)."""
    a, b = a.double(), b.double()
    denom = b.abs().max().item()
    return (a - b).abs().max().item() / denom if denom > 0 else (a - b).abs().max().item()


def assert_checkpointing_keeps_gradients(model: torch.nn.Module, x: torch.Tensor) -> None:
    """Gradients with set_grad_checkpointing(True) equal those without."""
    model.train()
    model(x).sum().backward()
    ref = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    model.set_grad_checkpointing(True)
    model(x).sum().backward()
    for a, b in zip(ref, (p.grad for p in model.parameters()), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    model.set_grad_checkpointing(False)
