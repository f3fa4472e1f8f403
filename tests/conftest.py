"""Shared fixtures and float64 reference implementations used across the test-suite."""

from __future__ import annotations

import pytest
import torch
from hypothesis import settings

settings.register_profile("linvit", deadline=None, max_examples=25, derandomize=True)
settings.load_profile("linvit")

torch.set_num_threads(2)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| / max |b| (0 when both vanish)."""
    a, b = a.double(), b.double()
    denom = b.abs().max().item()
    return (a - b).abs().max().item() / denom if denom > 0 else (a - b).abs().max().item()
