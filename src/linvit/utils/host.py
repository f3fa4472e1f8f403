"""The host a run or a benchmark ran on, as far as its floating-point results depend on it.

Two runs of one command on one seed give the same numbers only on the same CPU kind and threads: a matrix
product's summation order follows the kernel its library picks for the CPU's extensions and the thread count.
Every training run (config.json) and every benchmark record carries these fields, so such a difference can be
told from a change in the code.
"""

from __future__ import annotations

import functools
import platform

# the CPU flags that decide what a matrix product can run on (x86: AVX2/FMA, AVX-512 and its bf16/fp16/VNNI
# forms, AMX tiles; Arm: SVE/BF16/I8MM); recorded in this order when /proc/cpuinfo lists them
MATRIX_FLAGS = (
    "avx2",
    "fma",
    "avx512f",
    "avx512_vnni",
    "avx512_bf16",
    "avx512_fp16",
    "amx_tile",
    "amx_bf16",
    "amx_int8",
    "amx_fp16",
    "sve",
    "bf16",
    "i8mm",
)


@functools.cache
def cpu_info(path: str = "/proc/cpuinfo") -> dict:
    """{"cpu_model", "cpu_id", "cpu_extensions"}: the first processor's model name, its x86 family / model /
    stepping (one model name can cover several generations: "AMD EPYC" is Zen 4 and Zen 5) and its matrix flags
    (Linux), else what platform knows, no id and no flags."""
    model, flags, numbers = None, set(), {}
    try:
        with open(path) as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip().lower()
                if key in ("model name", "cpu model") and model is None:
                    model = value.strip()
                elif key in ("flags", "features") and not flags:
                    flags = set(value.split())
                elif key in ("cpu family", "model", "stepping") and key not in numbers:
                    numbers[key] = value.strip()
    except OSError:
        pass
    model = model or platform.processor() or platform.machine() or "unknown"
    keys = [k for k in ("cpu family", "model", "stepping") if k in numbers]
    cpu_id = " ".join(f"{k.removeprefix('cpu ')} {numbers[k]}" for k in keys)
    return {"cpu_model": model, "cpu_id": cpu_id or None, "cpu_extensions": [f for f in MATRIX_FLAGS if f in flags]}


NATIVE_BF16 = ("avx512_bf16", "amx_bf16")  # x86 bf16 dot products in hardware (measured); Arm's bf16 is not yet


def native_bf16(info: dict | None = None) -> bool:
    """Whether this CPU multiplies bfloat16 matrices in hardware; without it bf16 is emulated and slower."""
    return any(flag in (info or cpu_info())["cpu_extensions"] for flag in NATIVE_BF16)
