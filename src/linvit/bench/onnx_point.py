"""One benchmark point in onnxruntime: the point's model exported to ONNX at the point's size, timed in an
onnxruntime CPU session beside the eager point (`linvit bench --runtime onnxruntime`).

Run as ``python -m linvit.bench.onnx_point SPEC_JSON RESULT_JSON`` like linvit.bench.point. The graph is
exported per point at its own batch and size (a static graph, the form a deployment at one size runs; one
worker per point keeps a failed export to its own row), from the same model and seed as the eager point, with
the export's size-dependent choices made for that size (linvit.export). FLOPs are the eager model's, so the
two runtimes' FLOP/s compare the same work.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from ..errors import UsageError
from ..export import export_model, fix_size_dependent_choices
from ..onnx_runtime import cpu_session
from ..utils.flops import count_flops
from .machine import cpu_info
from .point import DEFAULTS, _time_steps, classify_workload, worker_main

TAKES = {"device": "cpu", "dtype": "fp32", "mode": "infer", "task": "classify", "compile": "off"}


def check_spec(settings: dict) -> None:
    """A one-line error for settings onnxruntime points do not take (float32 CPU classifier inference only)."""
    bad = [f"--{k} {settings.get(k)}" for k, v in TAKES.items() if settings.get(k, v) not in (v, [v])]
    if bad:
        raise UsageError(f"--runtime onnxruntime times float32 classifier inference on CPU; not {', '.join(bad)}")


def measure(spec: dict) -> dict:
    """Export spec's model at its batch and size, time the session like an eager point; its record."""
    spec = {**DEFAULTS, **spec}
    check_spec(spec)
    batch, res, cpu = int(spec["batch"]), int(spec["res"]), torch.device("cpu")
    torch.manual_seed(0)
    work = classify_workload(spec, batch, res, cpu)
    model = work.model.eval()
    fix_size_dependent_choices(model, (res, res))
    x = torch.randn(batch, 3, res, res)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "point.onnx"
        start = time.perf_counter()
        with torch.no_grad():
            export_model(model, "onnx", path, x, dynamic_batch=False)
        export_s = time.perf_counter() - start
        session = cpu_session(path, torch.get_num_threads())
        feed = {session.get_inputs()[0].name: x.numpy()}
        timing = _time_steps(lambda: session.run(None, feed), spec, cpu)
    with torch.inference_mode():
        flops = count_flops(lambda: model(x))
    times, median = timing.times, statistics.median(timing.times)
    quartiles = statistics.quantiles(times, n=4) if len(times) >= 2 else [median] * 3
    return {
        **{k: spec.get(k) for k in ("model", "res", "batch", "mode", "device", "dtype", "task", "compile")},
        **cpu_info(),
        "runtime": "onnxruntime",
        "threads": torch.get_num_threads(),
        "status": "ok",
        "reason": None,
        "tokens": work.tokens,
        "latency_ms": median * 1e3,
        "latency_min_ms": min(times) * 1e3,
        "latency_max_ms": max(times) * 1e3,
        "latency_iqr_ms": (quartiles[2] - quartiles[0]) * 1e3,
        "iters": len(times),
        "compile_s": None,
        "export_s": export_s,
        "images_per_s": batch / median,
        "peak_mem_mb": timing.peak_mb,
        "peak_total_mb": timing.total_mb,
        "gflops": flops / 1e9 if flops is not None else None,
        "gflops_per_s": flops / 1e9 / median if flops is not None else None,
        "energy_j_per_img": timing.joules / (len(times) * batch) if timing.joules is not None else None,
        "energy_reason": timing.energy_reason,
        "params": sum(p.numel() for p in model.parameters()),
    }


def main(argv: list[str] | None = None) -> int:
    return worker_main(measure, argv)


if __name__ == "__main__":
    sys.exit(main())
