"""Scalability benchmark: one subprocess per (model, resolution) point; latency, memory, FLOPs, energy."""

from ..models.variants import apply_variant, create_variant, split_name
from .report import exponents, fit_exponent, markdown_table, write_outputs
from .runner import ladder, run_point, sweep
from .suites import SUITES, suite_names

__all__ = [
    "run_point",
    "sweep",
    "ladder",
    "fit_exponent",
    "exponents",
    "markdown_table",
    "write_outputs",
    "create_variant",
    "apply_variant",
    "split_name",
    "SUITES",
    "suite_names",
]
