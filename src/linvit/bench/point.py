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
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from functools import partial

import torch
import torch.nn.functional as F

import linvit  # noqa: F401  (registers the models)

from ..errors import UsageError
from ..models.variants import create_any_size
from ..utils import compile_model
from ..utils.compile import CudaGraphSafe
from ..utils.flops import count_flops
from .machine import DTYPE_NAMES, apply_threads, cpu_info
from .meters import EnergyMeter, PeakMemory

DTYPES = {name: getattr(torch, dtype) for name, dtype in DTYPE_NAMES.items()}
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


@dataclass
class Workload:
    """What one benchmark point runs: the model, one inference call, one training loss, its token count."""

    model: torch.nn.Module
    infer: Callable[[torch.nn.Module], object]
    loss: Callable[[torch.nn.Module], torch.Tensor] | None
    tokens: int


def _patch_tokens(model: torch.nn.Module, height: int, width: int) -> int:
    backbone = getattr(model, "backbone", model)  # the segmenter's timm backbone, or the detector's pyramid
    backbone = getattr(backbone, "body", backbone)  # ... whose body is the timm backbone
    patch = getattr(getattr(backbone, "patch_embed", None), "patch_size", (16, 16))
    return (height // patch[0]) * (width // patch[1])


def classify_workload(spec: dict, batch: int, res: int, device: torch.device) -> Workload:
    """The classifier; position embeddings resampled per input (as deployed), never a weight sized to res."""
    model = create_any_size(spec["model"], **(spec.get("model_kwargs") or {})).to(device)
    x = torch.randn(batch, 3, res, res, device=device)
    target = torch.randint(0, max(1, getattr(model, "num_classes", 1000)), (batch,), device=device)
    loss = lambda net: F.cross_entropy(net(x).float(), target)  # noqa: E731
    return Workload(model, lambda net: net(x), loss, _patch_tokens(model, res, res))


def segment_workload(spec: dict, batch: int, res: int, device: torch.device) -> Workload:
    """Backbone + simple feature pyramid + semantic-FPN head, 150 classes (ADE20K)."""
    from ..segment import create_segmenter

    model = create_segmenter(spec["model"], num_classes=SEGMENT_CLASSES, **(spec.get("model_kwargs") or {}))
    model = model.to(device)
    x = torch.randn(batch, 3, res, res, device=device)
    target = torch.randint(0, SEGMENT_CLASSES, (batch, res, res), device=device)
    loss = lambda net: F.cross_entropy(net(x).float(), target)  # noqa: E731
    return Workload(model, lambda net: net(x), loss, _patch_tokens(model, res, res))


def detect_workload(spec: dict, batch: int, res: int, device: torch.device) -> Workload:
    """The whole Faster R-CNN (pyramid, RPN, RoI heads) at res x res*1333/800, inference only."""
    from ..detect import create_detector

    width = round(res * COCO_ASPECT)
    kwargs = spec.get("model_kwargs") or {}
    model = create_detector(spec["model"], DETECT_CLASSES, min_size=res, max_size=width, **kwargs).to(device)
    images = list(torch.rand(batch, 3, res, width, device=device))  # detectors take lists of [0, 1] images
    return Workload(model, lambda net: net(images), None, _patch_tokens(model, res, width))


def generate_workload(spec: dict, batch: int, res: int, device: torch.device) -> Workload:
    """A class-conditional DiT on a res x res latent (default DiT-S/2 on 4 channels, 1000 classes); the model
    name is its mixer. Inference is one sampling step with classifier-free guidance (the network runs on
    2 x batch); training is the DDPM loss's forward and backward at random timesteps."""
    from ..models import create_dit

    kwargs = {"size": "S", "patch_size": 2, "in_channels": 4, "num_classes": 1000, **(spec.get("model_kwargs") or {})}
    model = create_dit(kwargs.pop("size"), spec["model"], input_size=res, learn_sigma=False, **kwargs).to(device)
    x = torch.randn(batch, model.in_channels, res, res, device=device)
    t = torch.randint(0, 1000, (batch,), device=device)
    y = torch.randint(0, model.y_embedder.num_classes, (batch,), device=device)
    both = torch.cat([y, torch.full_like(y, model.y_embedder.num_classes)])
    noise = torch.randn_like(x)
    tokens = (res // model.patch_size) ** 2
    if spec.get("mode", "infer") == "infer":  # the guided step as the forward, so a compiled point compiles it
        infer = lambda net: net(torch.cat([x, x]), torch.cat([t, t]), both)  # noqa: E731
        return Workload(GuidedStep(model, 2.0), infer, None, tokens)
    loss = lambda net: F.mse_loss(net(x, t, y).float(), noise)  # noqa: E731
    return Workload(model, lambda net: net(x, t, y), loss, tokens)


class GuidedStep(torch.nn.Module):
    """A DiT's classifier-free-guided step as a module's forward: compile_model compiles forward only (a compiled
    DiT's forward_with_cfg is the eager method; the CUDA-graph wrapper has no such attribute)."""

    def __init__(self, dit: torch.nn.Module, cfg_scale: float) -> None:
        super().__init__()
        self.dit, self.cfg_scale = dit, cfg_scale

    def forward(self, x: torch.Tensor, t: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.dit.forward_with_cfg(x, t, y, self.cfg_scale)


WORKLOADS = {
    "classify": classify_workload,
    "segment": segment_workload,
    "detect": detect_workload,
    "generate": generate_workload,
}


def measure(spec: dict) -> dict:
    """Time spec["model"] at spec["res"]; returns the point's record (status "ok")."""
    spec = {**DEFAULTS, **spec}
    device = torch.device(spec["device"])
    if device.type == "cuda" and device.index is None:  # the memory-fraction cap needs an explicit index
        device = torch.device("cuda", torch.cuda.current_device())
    mode, batch, res = spec["mode"], int(spec["batch"]), int(spec["res"])
    if device.type == "cuda" and spec.get("mem_limit_gb"):
        total = torch.cuda.get_device_properties(device).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, spec["mem_limit_gb"] * 2**30 / total), device)
    torch.manual_seed(0)
    work = WORKLOADS[spec["task"]](spec, batch, res, device)
    if mode == "train" and work.loss is None:
        raise UsageError(f"--task {spec['task']} measures inference only")
    work.model.train(mode == "train")
    runner = _compiled(work.model, spec)
    autocast = torch.autocast(device.type, dtype=DTYPES[spec["dtype"]]) if spec["dtype"] != "fp32" else nullcontext()

    def step(net: torch.nn.Module = runner) -> None:
        if mode == "train":
            with autocast:
                loss = work.loss(net)
            loss.backward()
            work.model.zero_grad(set_to_none=True)
        else:
            with torch.inference_mode(), autocast:
                work.infer(net)

    timing = _time_steps(step, spec, device)
    flops = None
    if spec["warmup"]:  # FLOPs of the eager model from one more iteration, outside the memory window: the counter's
        flops = count_flops(partial(step, work.model))  # dispatch mode decomposes some ops into large temporaries
    return timing_record(spec, work, timing, flops, compile_s=timing.compile_s)


def timing_record(spec: dict, work, timing, flops: float | None, **extra) -> dict:
    """A timed point's record (latency quartiles, throughput, memory, FLOP/s, energy, the machine), shared by the
    eager and onnxruntime workers; extra: fields of one runtime (compile_s, export_s, runtime)."""
    times, batch = timing.times, int(spec["batch"])
    median = statistics.median(times)
    quartiles = statistics.quantiles(times, n=4) if len(times) >= 2 else [median, median, median]
    return {
        **{k: spec.get(k) for k in ("model", "res", "batch", "mode", "device", "dtype", "task", "compile")},
        **cpu_info(),
        "threads": torch.get_num_threads(),
        "status": "ok",
        "reason": None,
        "tokens": work.tokens,
        "latency_ms": median * 1e3,
        "latency_min_ms": min(times) * 1e3,
        "latency_max_ms": max(times) * 1e3,
        "latency_iqr_ms": (quartiles[2] - quartiles[0]) * 1e3,
        "iters": len(times),
        **extra,
        "images_per_s": batch / median,
        "peak_mem_mb": timing.peak_mb,
        "peak_total_mb": timing.total_mb,
        "gflops": flops / 1e9 if flops is not None else None,
        "gflops_per_s": flops / 1e9 / median if flops is not None else None,
        "energy_j_per_img": timing.joules / (len(times) * batch) if timing.joules is not None else None,
        "energy_reason": timing.energy_reason,
        "params": sum(p.numel() for p in work.model.parameters()),
    }


def _compiled(model: torch.nn.Module, spec: dict) -> torch.nn.Module:
    """compile_model's mode; spec["compile_backend"] (a CPU dry run of the GPU plan: dynamo's "eager") traces the
    same graph without generating code, so a whole plan of compiled points is checked in seconds."""
    if spec["compile"] == "off" or not spec.get("compile_backend"):
        return compile_model(model, spec["compile"])
    compiled = torch.compile(model, backend=spec["compile_backend"], dynamic=False)
    return CudaGraphSafe(compiled) if spec["compile"] == "reduce-overhead" else compiled


@dataclass
class Timing:
    times: list[float]  # seconds per timed iteration
    compile_s: float | None
    joules: float | None  # over the timed iterations
    energy_reason: str | None
    peak_mb: float
    total_mb: float


def _time_steps(step, spec: dict, device: torch.device) -> Timing:
    """Compile (timed apart), warm up, then time iterations inside one cold memory window."""
    energy = EnergyMeter(device)
    times: list[float] = []
    compile_s = None
    with PeakMemory(device) as mem:  # opens cold: a warmed-up allocator would hide the peak in reused memory
        if spec["compile"] != "off":  # the first call compiles (and captures the CUDA graph): timed apart
            compile_s = _timed(step, device)
        for _ in range(max(0, int(spec["warmup"]))):
            step()
        _sync(device)
        e0 = energy.joules()
        clock = time.perf_counter()
        iters = max(1, int(spec["iters"]))
        while len(times) < iters or time.perf_counter() - clock < spec["min_time_s"]:  # long enough for NVML
            times.append(_timed(step, device))
        e1 = energy.joules()
    joules = (e1 - e0) if e0 is not None else None
    return Timing(times, compile_s, joules, energy.reason, mem.peak / 2**20, mem.total / 2**20)


def classify_error(err: BaseException) -> str:
    """'oom' for allocator failures, else 'error'."""
    text = f"{type(err).__name__}: {err}".lower()
    oom_marks = ("out of memory", "can't allocate memory", "cannot allocate memory", "not enough memory")
    if isinstance(err, (MemoryError, torch.OutOfMemoryError)) or any(m in text for m in oom_marks):
        return "oom"
    return "error"


def raised_at(err: BaseException) -> str:
    """Where err was raised, as file:line (the innermost frame; linvit's innermost frame too when it differs), so
    an error row says where to look without its log."""
    frames = traceback.extract_tb(err.__traceback__)
    if not frames:
        return "unknown"
    ours = [f for f in frames if "linvit" in f.filename]
    where = [frames[-1]] + ([ours[-1]] if ours and ours[-1] is not frames[-1] else [])
    return " from ".join(f"{_short(f.filename)}:{f.lineno}" for f in where)


def _short(path: str) -> str:
    """A path from its package root (site-packages/ or src/ stripped)."""
    for marker in ("site-packages/", "/src/"):
        if marker in path:
            return path.rsplit(marker, 1)[1]
    return path


def error_reason(err: BaseException) -> str:
    """One line for an error row: the exception, its message (cut) and where it was raised."""
    return f"{type(err).__name__}: {str(err)[:300]} (at {raised_at(err)})"


def main(argv: list[str] | None = None) -> int:
    return worker_main(measure, argv)


def worker_main(measure_point, argv: list[str] | None = None) -> int:
    """A timing worker's entry: measure_point(spec) for the spec in argv, its record (or its error row) written to
    the result path; every worker module (eager, onnxruntime) runs through this one."""
    spec_json, result_path = (argv or sys.argv[1:])[:2]
    spec = json.loads(spec_json)
    apply_threads(spec.get("threads"))  # the environment sized the thread pools already; torch's own count too
    try:
        record = measure_point(spec)
    except BaseException as err:  # noqa: BLE001 - every failure becomes this point's status
        record = {**spec, "status": classify_error(err), "reason": error_reason(err)}
        traceback.print_exc()
    with open(result_path, "w") as f:
        json.dump(record, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
