"""Measure one benchmark point (model, resolution, batch, mode) in this process.

Run by the sweep as ``python -m linvit.bench.point SPEC_JSON RESULT_JSON`` so an out-of-memory error,
a crash or a hang costs only this point. Latency is per iteration (one batch), after warm-up.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
import traceback
from contextlib import nullcontext
from functools import partial

import torch

import linvit  # noqa: F401  (registers the models)

from ..errors import UsageError
from ..models.variants import create_any_size
from ..utils import compile_model
from ..utils.flops import count_flops
from .meters import EnergyMeter, PeakMemory

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
DEFAULTS = {
    "batch": 1,
    "mode": "infer",
    "device": "cpu",
    "dtype": "fp32",
    "warmup": 1,
    "iters": 3,
    "task": "classify",
    "compile": "off",
    "min_time_s": 0.0,
}
SEGMENT_CLASSES = 150  # ADE20K
DETECT_CLASSES = 81  # COCO's 80 categories + background
COCO_ASPECT = 1333 / 800  # detection points are res x round(res * 1333 / 800), COCO's resize at res = 800


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(step, device: torch.device) -> float:
    """Seconds one call of step takes: CUDA events on a GPU (device time, no host polling), else wall clock."""
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3
    t0 = time.perf_counter()
    step()
    return time.perf_counter() - t0


def measure(spec: dict) -> dict:
    """Time spec["model"] at spec["res"]; returns the point's record (status "ok")."""
    spec = {**DEFAULTS, **spec}
    device = torch.device(spec["device"])
    if device.type == "cuda" and device.index is None:  # the memory-fraction cap needs an explicit index
        device = torch.device("cuda", torch.cuda.current_device())
    dtype = DTYPES[spec["dtype"]]
    mode, batch, res = spec["mode"], int(spec["batch"]), int(spec["res"])
    warmup, iters = max(0, int(spec["warmup"])), max(1, int(spec["iters"]))
    if device.type == "cuda" and spec.get("mem_limit_gb"):
        total = torch.cuda.get_device_properties(device).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, spec["mem_limit_gb"] * 2**30 / total), device)
    torch.manual_seed(0)
    kwargs = spec.get("model_kwargs") or {}
    if spec.get("task") == "segment":  # backbone + simple feature pyramid + semantic-FPN head, 150 classes
        from ..segment import create_segmenter

        model = create_segmenter(spec["model"], num_classes=SEGMENT_CLASSES, **kwargs)
        target_shape = (batch, res, res)
    elif spec.get("task") == "detect":  # the whole Faster R-CNN (pyramid, RPN, RoI heads), inference only
        from ..detect import create_detector

        if mode != "infer":
            raise UsageError("--task detect measures inference only")
        width = round(res * COCO_ASPECT)
        model = create_detector(spec["model"], DETECT_CLASSES, min_size=res, max_size=width, **kwargs)
        target_shape = (batch,)
    else:  # position embeddings resampled per input (as deployed), never a weight sized to the resolution
        model = create_any_size(spec["model"], **kwargs)
        target_shape = (batch,)
    model = model.to(device)
    model.train(mode == "train")
    runner = compile_model(model, spec["compile"])
    width = round(res * COCO_ASPECT) if spec.get("task") == "detect" else res
    x = torch.randn(batch, 3, res, width, device=device)
    inputs = list(x.uniform_(0, 1)) if spec.get("task") == "detect" else x  # detectors take lists of [0, 1] images
    target = torch.randint(0, max(1, getattr(model, "num_classes", 1000)), target_shape, device=device)
    autocast = torch.autocast(device.type, dtype=dtype) if dtype != torch.float32 else nullcontext()

    def step(net: torch.nn.Module = runner) -> None:
        if mode == "train":
            with autocast:
                loss = torch.nn.functional.cross_entropy(net(x).float(), target)
            loss.backward()
            model.zero_grad(set_to_none=True)
        else:
            with torch.inference_mode(), autocast:
                net(inputs)

    energy = EnergyMeter(device)
    times: list[float] = []
    flops = compile_s = None
    with PeakMemory(device) as mem:  # opens cold: a warmed-up allocator would hide the peak in reused memory
        if spec["compile"] != "off":  # the first call compiles (and captures the CUDA graph): timed apart
            compile_s = _timed(step, device)
        for _ in range(warmup):
            step()
        _sync(device)
        e0 = energy.joules()
        clock = time.perf_counter()
        while len(times) < iters or time.perf_counter() - clock < spec["min_time_s"]:  # long enough for NVML
            times.append(_timed(step, device))
        e1 = energy.joules()
    if warmup:  # FLOPs of the eager model from one more iteration, outside the memory window: the counter's
        flops = count_flops(partial(step, model))  # dispatch mode decomposes some ops into large temporaries
    median = statistics.median(times)
    backbone = getattr(model, "backbone", model)  # the segmenter's timm backbone, or the detector's pyramid
    backbone = getattr(backbone, "body", backbone)  # ... whose body is the timm backbone
    patch = getattr(getattr(backbone, "patch_embed", None), "patch_size", (16, 16))
    return {
        **{k: spec.get(k) for k in ("model", "res", "batch", "mode", "device", "dtype", "task", "compile")},
        "status": "ok",
        "reason": None,
        "tokens": (res // patch[0]) * (width // patch[1]),
        "latency_ms": median * 1e3,
        "latency_min_ms": min(times) * 1e3,
        "latency_max_ms": max(times) * 1e3,
        "latency_iqr_ms": (statistics.quantiles(times, n=4)[2] - statistics.quantiles(times, n=4)[0]) * 1e3
        if len(times) >= 2
        else 0.0,
        "iters": len(times),
        "compile_s": compile_s,
        "images_per_s": batch / median,
        "peak_mem_mb": mem.peak / 2**20,
        "peak_total_mb": mem.total / 2**20,
        "gflops": flops / 1e9 if flops is not None else None,
        "gflops_per_s": flops / 1e9 / median if flops is not None else None,
        "energy_j_per_img": (e1 - e0) / (len(times) * batch) if e0 is not None else None,
        "energy_reason": energy.reason,
        "params": sum(p.numel() for p in model.parameters()),
    }


def classify_error(err: BaseException) -> str:
    """'oom' for allocator failures, else 'error'."""
    text = f"{type(err).__name__}: {err}".lower()
    oom_marks = ("out of memory", "can't allocate memory", "cannot allocate memory", "not enough memory")
    if isinstance(err, (MemoryError, torch.OutOfMemoryError)) or any(m in text for m in oom_marks):
        return "oom"
    return "error"


def main(argv: list[str] | None = None) -> int:
    spec_json, result_path = (argv or sys.argv[1:])[:2]
    spec = json.loads(spec_json)
    try:
        record = measure(spec)
    except BaseException as err:  # noqa: BLE001 - every failure becomes this point's status
        record = {**spec, "status": classify_error(err), "reason": f"{type(err).__name__}: {str(err)[:300]}"}
        traceback.print_exc()
    with open(result_path, "w") as f:
        json.dump(record, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
