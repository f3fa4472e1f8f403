"""One benchmark point in onnxruntime: the point's model exported to ONNX at the point's size, timed in an
onnxruntime CPU session beside the eager point (`linvit bench --runtime onnxruntime`); with runtime
``onnxruntime-int8``, that graph's onnxruntime dynamic int8 quantization (`linvit export --quantize int8`'s).

Run as ``python -m linvit.bench.onnx_point SPEC_JSON RESULT_JSON`` like linvit.bench.point. The graph is
exported per point at its own batch and size (a static graph, the form a deployment at one size runs; one
worker per point keeps a failed export to its own row), from the same model and seed as the eager point, with
the export's size-dependent choices made for that size (linvit.export). FLOPs are the eager model's, so the
two runtimes' FLOP/s compare the same work.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import torch

from ..errors import UsageError
from ..export import export_model, fix_size_dependent_choices
from ..onnx_runtime import cpu_session, quantize_int8
from ..utils.flops import count_flops
from .point import DEFAULTS, _time_steps, classify_workload, timing_record, worker_main

RUNTIMES = ("onnxruntime", "onnxruntime-int8")  # the graph as exported, and its int8 quantization
TAKES = {"device": "cpu", "dtype": "fp32", "mode": "infer", "task": "classify", "compile": "off"}


def check_spec(settings: dict) -> None:
    """A one-line error for settings onnxruntime points do not take (float32 CPU classifier inference only)."""
    bad = [f"--{k} {settings.get(k)}" for k, v in TAKES.items() if settings.get(k, v) not in (v, [v])]
    if bad:
        runtime = settings.get("runtime") or RUNTIMES[0]
        raise UsageError(f"--runtime {runtime} times float32 classifier inference on CPU; not {', '.join(bad)}")


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
        if spec.get("runtime") == "onnxruntime-int8":
            quantize_int8(path, path.with_suffix(".int8.onnx"))
            path = path.with_suffix(".int8.onnx")
        export_s = time.perf_counter() - start  # int8: its quantization included
        session = cpu_session(path, torch.get_num_threads())
        feed = {session.get_inputs()[0].name: x.numpy()}
        timing = _time_steps(lambda: session.run(None, feed), spec, cpu)
    with torch.inference_mode():
        flops = count_flops(lambda: model(x))
    runtime = spec.get("runtime") or RUNTIMES[0]
    return timing_record(spec, work, timing, flops, runtime=runtime, compile_s=None, export_s=export_s)


def main(argv: list[str] | None = None) -> int:
    return worker_main(measure, argv)


if __name__ == "__main__":
    sys.exit(main())
