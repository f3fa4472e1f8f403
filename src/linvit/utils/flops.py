"""FLOP counting for benchmarks, `linvit models --macs`, `segment eval --flops-at` and the reproduce report."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.utils import flop_counter


def _count_cpu_attention() -> None:
    """torch's FLOP counter knows the CUDA attention kernels but not the CPU flash kernel that fused
    scaled_dot_product_attention runs on CPU, so fused softmax attention counted as free there."""
    aten = torch.ops.aten
    forward = aten._scaled_dot_product_flash_attention_for_cpu
    if forward not in flop_counter.flop_registry:
        flop_counter.register_flop_formula(forward, get_raw=True)(flop_counter.sdpa_flop)  # already shape-wrapped
        backward = aten._scaled_dot_product_flash_attention_for_cpu_backward
        flop_counter.register_flop_formula(backward, get_raw=True)(flop_counter.sdpa_backward_flop)


def bmm_flop(a_shape, b_shape, *args, **kwargs) -> int:
    """2*b*m*n*k for (b, m, k) @ (b, k, n). Ours, not torch's: torch 2.9-2.11's formula takes a third positional
    argument as the output shape, so bmm's out_dtype overload (Katz-InfSA's half products with float32 sums on
    CUDA) raised a TypeError inside the counter and the point failed."""
    b, m, k = a_shape
    n = b_shape[-1]
    return 2 * b * m * n * k


CUSTOM_FORMULAS = {torch.ops.aten.bmm: bmm_flop}


def count_flops(step: Callable[[], object]) -> int:
    """FLOPs of one call of ``step`` (2 per multiply-add), attention kernels included on every device."""
    _count_cpu_attention()
    with flop_counter.FlopCounterMode(display=False, custom_mapping=CUSTOM_FORMULAS) as counter:
        step()
    return counter.get_total_flops()
