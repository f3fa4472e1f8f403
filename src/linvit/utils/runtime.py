"""Run-time state: seeding, the RNG states a resumed run restores, and autocast for `--amp`."""

from __future__ import annotations

import random
from contextlib import nullcontext

import numpy as np
import torch

AMP_DTYPES = {"none": None, "bf16": torch.bfloat16, "fp16": torch.float16}


def autocast(device: torch.device, amp: str):
    """torch.autocast on device's type in `--amp`'s dtype, or no context for "none"."""
    dtype = AMP_DTYPES[amp]
    return torch.autocast(device.type, dtype=dtype) if dtype is not None else nullcontext()


def resolve_amp(device: torch.device, amp: str) -> str:
    """--amp auto (predict's default): bf16 autocast on a CPU with native bf16 matrix products, where the 4-layer
    softmax and InfSA families ran 1.7-3.0x faster than in float32 (docs/benchmarks.md) and trained 16-token
    ones kept their top-1 within 0.2 points (docs/export.md); float32 elsewhere, GPUs included."""
    from .host import native_bf16

    if amp != "auto":
        return amp
    return "bf16" if device.type == "cpu" and native_bf16() else "none"


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def rng_states() -> dict:
    """RNG states in types torch.load(weights_only=True) accepts (numpy's array as a tensor)."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    return {
        "torch": torch.get_rng_state(),
        "numpy": [kind, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, gauss],
        "python": random.getstate(),
    }


def set_rng_states(states: dict) -> None:
    torch.set_rng_state(states["torch"])
    kind, keys, pos, has_gauss, gauss = states["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
    random.setstate(tuple(tuple(x) if isinstance(x, list) else x for x in states["python"]))
