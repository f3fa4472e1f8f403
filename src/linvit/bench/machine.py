"""The machine a benchmark ran on: CPU model, matrix extensions, threads, and its own GEMM peak per dtype.

A latency alone cannot say whether it is good; its share of the matrix-product throughput this machine reaches
in the same run, with the same threads, can (issue 48). Run by the sweep as
``python -m linvit.bench.machine SPEC_JSON RESULT_JSON``, a worker like the points' (same environment and threads).
"""

from __future__ import annotations

import json
import os
import sys
import time

from ..utils.host import MATRIX_FLAGS, cpu_info  # noqa: F401 (bench's spelling of both)

THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")  # read by the OpenMP / MKL runtimes when torch loads
DTYPE_NAMES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}  # torch's, without importing torch here
PEAK_DTYPES = ("fp32", "bf16")
WINDOW_S = 0.2  # one timed window of square matmuls
BEST_OF = 3


def thread_env(threads: int | None, env: dict | None = None) -> dict:
    """The environment of a worker that should run ``threads`` intra-op threads (unchanged when None): the
    OpenMP and MKL pools are sized from it when the worker imports torch, before set_num_threads runs."""
    env = dict(os.environ if env is None else env)
    if threads:
        env.update({name: str(int(threads)) for name in THREAD_VARIABLES})
    return env


def apply_threads(threads: int | None) -> int:
    """Set torch's intra-op threads in this (worker) process when asked; returns the number it runs with."""
    import torch

    if threads:
        torch.set_num_threads(int(threads))
    return torch.get_num_threads()


def _matmul_seconds(n: int, dtype, device, reps: int) -> float:
    """Wall seconds of reps n x n matmuls (synchronised on a GPU)."""
    import torch

    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    a @ b  # warm-up: the library's kernel choice and first-touch of the output
    sync()
    start = time.perf_counter()
    for _ in range(reps):
        a @ b
    sync()
    return time.perf_counter() - start


def gemm_peak(dtype: str, device: str = "cpu", window_s: float = WINDOW_S, best_of: int = BEST_OF) -> dict:
    """This process's matmul throughput in ``dtype``: square matmuls sized from a small one's rate so that each
    takes about a quarter of the window, the window repeated ``best_of`` times, the best kept (GFLOP/s, 2n^3 per
    product)."""
    import torch

    dev, torch_dtype = torch.device(device), getattr(torch, DTYPE_NAMES[dtype])
    probe = 256
    rate = 2 * probe**3 / max(_matmul_seconds(probe, torch_dtype, dev, 2) / 2, 1e-9)
    n = int(min(8192, max(128, round((rate * window_s / 4 / 2) ** (1 / 3) / 128) * 128)))
    one = max(_matmul_seconds(n, torch_dtype, dev, 1), 1e-9)
    reps = max(1, round(window_s / one))
    best = min(_matmul_seconds(n, torch_dtype, dev, reps) for _ in range(max(1, best_of)))
    return {"dtype": dtype, "n": n, "reps": reps, "best_of": best_of, "gflops_per_s": 2 * n**3 * reps / best / 1e9}


def measure(spec: dict) -> dict:
    """The machine record of one run: CPU model and extensions, threads, and the GEMM peak per dtype."""
    import torch

    threads = apply_threads(spec.get("threads"))
    device = spec.get("device", "cpu")
    gemm = {
        d: gemm_peak(d, device, spec.get("window_s", WINDOW_S), spec.get("best_of", BEST_OF)) for d in spec["dtypes"]
    }
    name = torch.cuda.get_device_name() if device.startswith("cuda") else cpu_info()["cpu_model"]
    return {"status": "ok", **cpu_info(), "threads": threads, "device": device, "device_name": name, "gemm": gemm}


def main(argv: list[str] | None = None) -> int:
    spec_json, result_path = (argv or sys.argv[1:])[:2]
    spec = json.loads(spec_json)
    try:
        record = measure(spec)
    except Exception as err:  # noqa: BLE001 - a machine without a dtype's matmul still gets its points
        record = {**spec, "status": "error", "reason": f"{type(err).__name__}: {str(err)[:300]}"}
    with open(result_path, "w") as f:
        json.dump(record, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
