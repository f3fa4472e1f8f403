"""Benchmark sweeps: one subprocess per point, with timeout and memory-limit enforcement, and a ladder."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable

from tqdm import tqdm

from .machine import cpu_info, thread_env
from .meters import rss_bytes
from .report import series_label


def run_point(spec: dict, timeout: float | None = None, mem_limit_gb: float | None = None) -> dict:
    """Measure spec in a fresh interpreter; failures come back as status oom / timeout / error.

    On CPU a watcher thread polls the child's resident set and kills it past ``mem_limit_gb``
    (recorded as ``oom``); on CUDA the child caps its allocator at the same amount. Every record names the CPU,
    its matrix extensions and the threads (the worker's own count; a failed point's, the count it was given).
    """
    spec = {**spec, "mem_limit_gb": mem_limit_gb}
    host = {**cpu_info(), "threads": spec.get("threads") or _default_threads()}
    host["runtime"] = spec.get("runtime", "eager")
    module = "linvit.bench.onnx_point" if host["runtime"].startswith("onnxruntime") else "linvit.bench.point"
    return {**host, **run_worker(module, spec, timeout, mem_limit_gb)}


def run_worker(module: str, spec: dict, timeout: float | None = None, mem_limit_gb: float | None = None) -> dict:
    """``python -m module SPEC_JSON RESULT_JSON`` in a fresh interpreter with spec["threads"] in its environment;
    its result, or spec with status oom / timeout / error. A runtime or a meter is one such worker module."""
    with tempfile.TemporaryDirectory() as tmp:
        result_path = os.path.join(tmp, "result.json")
        log_path = os.path.join(tmp, "stderr.txt")
        with open(log_path, "w") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", module, json.dumps(spec), result_path],
                stdout=subprocess.DEVNULL,
                stderr=log,
                env=thread_env(spec.get("threads")),
            )
        over_limit = threading.Event()
        if mem_limit_gb and spec.get("device", "cpu") == "cpu":
            _watch_memory(proc, mem_limit_gb * 2**30, over_limit)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            return {**spec, "status": "timeout", "reason": f"exceeded --timeout {timeout:g} s"}
        if over_limit.is_set():
            return {**spec, "status": "oom", "reason": f"resident memory exceeded --mem-limit {mem_limit_gb:g} GB"}
        if os.path.exists(result_path):
            with open(result_path) as f:
                return json.load(f)
        with open(log_path) as f:
            tail = f.read().strip().splitlines()[-1:] or [""]
        status = "oom" if proc.returncode == -9 else "error"  # SIGKILL without our watcher: the kernel OOM killer
        return {**spec, "status": status, "reason": f"exit code {proc.returncode}: {tail[0][:300]}"}


def _watch_memory(proc: subprocess.Popen, limit: float, over_limit: threading.Event) -> None:
    """Kill proc from a daemon thread once its resident set passes limit bytes, setting over_limit."""

    def watch() -> None:
        while proc.poll() is None:
            if rss_bytes(proc.pid) > limit:
                over_limit.set()
                proc.kill()
                return
            time.sleep(0.01)

    threading.Thread(target=watch, daemon=True).start()


def _default_threads() -> int:
    """The threads a worker given none starts with: this process's count (the same environment)."""
    import torch

    return torch.get_num_threads()


def measure_machine(
    device: str, threads: int | None, dtypes: Iterable[str], timeout: float | None = 300, **peak
) -> dict:
    """The run's machine record (CPU, extensions, threads, GEMM peak per dtype), measured by a worker like the
    points' (same environment and threads); a failure comes back as its status and reason. ``peak``: window_s,
    best_of (machine.gemm_peak)."""
    spec = {"device": device, "threads": threads, "dtypes": list(dict.fromkeys(dtypes)), **peak}
    return run_worker("linvit.bench.machine", spec, timeout)


def best_peak(before: dict, after: dict) -> dict:
    """The machine record with each dtype's better GEMM peak of two measurements, before and after the points:
    whatever else runs during one (a process finishing) depresses it, and a peak below what a point reached is
    no limit. Both measurements are kept (gemm_measured)."""
    if before.get("status") != "ok" or after.get("status") != "ok":
        return before if before.get("status") == "ok" else after
    gemm = {
        d: max(g, after["gemm"].get(d, g), key=lambda peak: peak["gflops_per_s"]) for d, g in before["gemm"].items()
    }
    return {**before, "gemm": gemm, "gemm_measured": [before["gemm"], after["gemm"]]}


def busy_machine(machine: dict, ratio: float = 1.5) -> bool:
    """Whether a dtype's two peak readings (best_peak's) lie ratio apart: something else ran during the points."""
    if len(machine.get("gemm_measured") or []) != 2:
        return False
    before, after = machine["gemm_measured"]
    rates = [(before[d]["gflops_per_s"], after[d]["gflops_per_s"]) for d in before if d in after]
    return any(max(x, y) > ratio * min(x, y) for x, y in rates)


def with_shares(records: list[dict], machine: dict | None) -> list[dict]:
    """Each ok point with its dtype's GEMM peak and the share of it the point achieved (FLOPs / latency). The peak
    is PyTorch's own product, so only eager points get a share: an onnxruntime graph runs other kernels (and an
    int8 one other arithmetic) and can pass it."""
    gemm = (machine or {}).get("gemm") or {}
    out = []
    for r in records:
        peak = (gemm.get(r.get("dtype")) or {}).get("gflops_per_s")
        eager = r.get("runtime", "eager") == "eager"
        achieved = r.get("gflops_per_s") if r.get("status") == "ok" and eager else None
        share = achieved / peak if achieved is not None and peak else None
        out.append({**r, "gemm_peak_gflops_per_s": peak, "peak_share": share})
    return out


def sweep(
    models: Iterable[str],
    resolutions: Iterable[int],
    common: dict,
    timeout: float | None = None,
    mem_limit_gb: float | None = None,
    progress: bool = True,
    batches: Iterable[int] | None = None,
    compiles: Iterable[str] | None = None,
) -> list[dict]:
    """Every (model, compile mode, batch, resolution) point with the shared settings in ``common``.

    ``batches`` / ``compiles`` default to common's single "batch" / "compile" value.
    """
    batches = list(batches or [common.get("batch", 1)])
    compiles = list(compiles or [common.get("compile", "off")])
    points = [
        dict(common, model=m, res=r, batch=b, compile=c)
        for m in models
        for c in compiles
        for b in batches
        for r in resolutions
    ]
    records = []
    bar = tqdm(points, desc="bench", unit="point", disable=not progress)
    for spec in bar:
        bar.set_postfix_str(f"{series_label(spec)} @ {spec['res']}")
        records.append(run_point(spec, timeout, mem_limit_gb))
    return records


def ladder(
    models: Iterable[str],
    start: int,
    common: dict,
    timeout: float | None = None,
    mem_limit_gb: float | None = None,
    max_res: int = 65536,
    progress: bool = True,
) -> tuple[list[dict], dict[str, int | None]]:
    """Per model, double the resolution from ``start`` until a point fails; returns records and max ok res."""
    records, best = [], {}
    bar = tqdm(desc="ladder", unit="point", disable=not progress)
    for model in models:
        res, best[model] = start, None
        while res <= max_res:
            bar.set_postfix_str(f"{model} @ {res}")
            record = run_point(dict(common, model=model, res=res), timeout, mem_limit_gb)
            bar.update()
            records.append(record)
            if record["status"] != "ok":
                break
            best[model] = res
            res *= 2
    bar.close()
    return records, best
