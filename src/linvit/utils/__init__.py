"""Utilities shared by the engines and applications (runtime helpers that hold no model math)."""

from .compile import COMPILE_MODES, compile_model
from .paths import output_dir

__all__ = ["COMPILE_MODES", "compile_model", "output_dir"]
