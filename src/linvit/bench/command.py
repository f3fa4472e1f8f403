"""`linvit bench` and `linvit models`: the command bodies (the CLI only parses and dispatches)."""

from __future__ import annotations

import dataclasses
import json
import sys
from functools import partial
from pathlib import Path

import torch

from ..config import Config
from ..errors import UsageError
from ..models.dit import dit_mixers
from ..models.variants import check_model_name, split_name
from ..utils import COMPILE_MODES
from ..utils.flops import count_flops
from .machine import PEAK_DTYPES
from .onnx_point import RUNTIMES as GRAPH_RUNTIMES
from .opcount import count_ops
from .report import machine_line, write_outputs
from .runner import best_peak, busy_machine, ladder, measure_machine, sweep, with_shares
from .suites import SUITES, suite_names

# --runtime: the graphs timed beside each eager point (bench.onnx_point): none, the float32 one, both
RUNTIMES = {"eager": (), "onnxruntime": GRAPH_RUNTIMES[:1], "onnxruntime-int8": GRAPH_RUNTIMES}


@dataclasses.dataclass
class BenchConfig(Config):
    """`linvit bench`: a sweep of --models or a recorded --suite, and how each point is measured. device
    defaults to cpu (the recorded CPU tables); auto is cuda when torch sees one."""

    models: list[str] | None = None
    suite: str | None = None
    res: list[int] = dataclasses.field(default_factory=lambda: [224, 512, 1024])
    batch: list[int] | None = None  # None: [1] (or the suite's)
    compile: list[str] | None = None  # None: ["off"] (or the suite's)
    min_time: float = 0.0
    dry_run: bool = False
    mode: str = "infer"
    task: str = "classify"
    device: str = "cpu"
    dtype: str = "fp32"
    warmup: int = 1
    iters: int = 5
    timeout: float = 600.0
    mem_limit: float | None = None
    ladder: bool = False
    reference: list[str] = dataclasses.field(default_factory=list)
    model_kwargs: dict = dataclasses.field(default_factory=dict)
    output: str | None = None
    threads: int | None = None  # every worker's (points and the GEMM peak); None: torch's default
    runtime: str = "eager"  # "onnxruntime": each point also as its exported graph in onnxruntime (bench.onnx_point);
    # "onnxruntime-int8": also as that graph's int8 quantization


def run_bench(config: BenchConfig) -> None:
    """Sweep models x resolutions (x batches x compile modes), one subprocess per point; write the outputs."""
    if not config.output:
        raise UsageError("give --output DIR")
    if config.device == "auto":
        config = config.replace(device="cuda" if torch.cuda.is_available() else "cpu")
    if config.runtime not in RUNTIMES:
        raise UsageError(f"--runtime takes {', '.join(RUNTIMES)}, got {config.runtime!r}")
    if config.runtime != "eager":
        _check_onnxruntime_run(config)
    if config.suite:
        plans = [_suite_plan(config, name) for name in suite_names(config.suite)]
    elif config.dry_run:  # it shrinks a suite's points; --models' points are the flags' own
        raise UsageError("--dry-run checks a --suite's plan at 32 px; with --models, give --res 32 --iters 1 instead")
    elif config.models:
        plans = [_flag_plan(config)]
    else:
        raise UsageError("give --models (comma list) or --suite")
    machines: dict[tuple, dict] = {}  # measured once per run (per device and dtypes), shared by its plans
    for plan in plans:
        if config.suite:
            print(f"== suite {plan['name']}")
        common = plan["common"]
        dtypes = (*PEAK_DTYPES, common["dtype"])
        key = (common["device"], dtypes)
        if not config.dry_run and key not in machines:
            machines[key] = measure_machine(common["device"], config.threads, dtypes)
            print(machine_line(machines[key]))
        _run_plan(**{k: v for k, v in plan.items() if k != "name"}, machine=machines.get(key))


def _common(config: BenchConfig, **overrides) -> dict:
    """The settings every point of one sweep shares, from the flags (a suite overrides some)."""
    common = dict(
        mode=config.mode,
        device=config.device,
        dtype=config.dtype,
        warmup=config.warmup,
        iters=config.iters,
        min_time_s=config.min_time,
        model_kwargs=config.model_kwargs,
        task=config.task,
        threads=config.threads,
    )
    return {**common, **overrides}


def _flag_plan(config: BenchConfig) -> dict:
    return dict(
        name=None,
        models=config.models,
        res=config.res,
        out=config.output,
        ladder_mode=config.ladder,
        references=config.reference,
        timeout=config.timeout,
        mem_limit=config.mem_limit,
        batches=config.batch or [1],
        compiles=config.compile or ["off"],
        common=_common(config),
        command="linvit " + " ".join(sys.argv[1:]),
        runtime=config.runtime,
    )


def _suite_plan(config: BenchConfig, name: str) -> dict:
    """A recorded table: the suite's settings over the flags' (--batch / --compile given explicitly win)."""
    suite = SUITES[name]
    device, dtype = suite.get("device", config.device), suite.get("dtype", config.dtype)
    res, batches = suite["res"], config.batch or suite.get("batch", [1])
    iters, warmup = suite.get("iters", config.iters), suite.get("warmup", config.warmup)
    min_time = suite.get("min_time", config.min_time)
    if config.dry_run:  # the same points, tiny: a check of the plan on any machine
        res, batches, iters, warmup, min_time, device = [32], batches[:1], 1, 1, 0.0, config.device
    common = _common(
        config,
        mode=suite.get("mode", config.mode),
        device=device,
        dtype=dtype,
        warmup=warmup,
        iters=iters,
        min_time_s=min_time,
        model_kwargs=suite.get("model_kwargs", {}),
        task=suite.get("task", config.task),
    )
    return dict(
        name=name,
        models=suite["models"],
        res=res,
        out=str(Path(config.output) / name),
        ladder_mode=suite.get("ladder", False),
        references=suite.get("reference", []),
        timeout=suite.get("timeout", config.timeout),
        mem_limit=suite.get("mem_limit", config.mem_limit),
        batches=batches,
        compiles=config.compile or suite.get("compile", ["off"]),
        common=common,
        command=f"linvit bench --suite {name} --device {device} --dtype {dtype} --output {config.output}",
    )


def _run_plan(
    models,
    res,
    out,
    ladder_mode,
    references,
    timeout,
    mem_limit,
    batches,
    compiles,
    common,
    command,
    machine=None,
    runtime="eager",
):
    for spec in [*models, *references]:  # fail fast on an unknown model, variant or mixer
        if common["task"] != "generate":
            check_model_name(split_name(spec)[0])
        elif spec not in dit_mixers():
            raise UsageError(f"--task generate takes DiT mixers as --models ({', '.join(dit_mixers())}); got {spec!r}")
    for mode in compiles:
        if mode not in COMPILE_MODES:
            raise UsageError(f"--compile takes {', '.join(COMPILE_MODES)}, got {mode!r}")
    if min(batches) < 1:
        raise UsageError(f"--batch must be positive, got {batches}")
    if common["device"] == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda requested but torch sees no CUDA device")
    extra = {"command": command, "settings": {**common, "batch": batches, "compile": compiles}, "machine": machine}
    if ladder_mode:
        if len(batches) > 1 or len(compiles) > 1:
            raise UsageError("--ladder takes one --batch and one --compile mode")
        point = dict(common, batch=batches[0], compile=compiles[0])
        records, extra["ladder_max_res"] = ladder(models, res[0], point, timeout, mem_limit)
    else:
        records = sweep(models, res, common, timeout, mem_limit, batches=batches, compiles=compiles)
        for graph in RUNTIMES[runtime]:  # the same points as exported graphs, beside the eager ones
            ort = {**common, "runtime": graph}
            records += sweep(models, res, ort, timeout, mem_limit, batches=batches, compiles=compiles)
    if machine is not None:  # measured again after the points, the better of the two kept (runner.best_peak)
        dtypes = (*PEAK_DTYPES, common["dtype"])
        machine = best_peak(machine, measure_machine(common["device"], common.get("threads"), dtypes))
        extra["machine"] = machine
        if busy_machine(machine):
            print("warning: the GEMM peak read 1.5x apart before and after the points: a busy machine; time again")
    records = with_shares(records, machine)
    if any((r.get("peak_share") or 0) > 1 for r in records):
        print("warning: a point above its dtype's GEMM peak: the peak was measured low (a busy machine?)")
    slopes = write_outputs(records, Path(out), extra, references=references)
    print((Path(out) / "bench.md").read_text())
    for model, slope in slopes.items():
        print(f"scaling exponent (latency ~ tokens^k) {model}: {'n/a' if slope is None else f'{slope:.3f}'}")
    for model, best_res in extra.get("ladder_max_res", {}).items():
        print(f"largest resolution that ran {model}: {best_res if best_res else 'none'}")
    print(f"wrote {out}/bench.json, bench.csv, bench.md, scaling.png")


def _check_onnxruntime_run(config: BenchConfig) -> None:
    """One line, before anything is measured, for what --runtime onnxruntime does not take or lacks."""
    import importlib.util

    from .onnx_point import check_spec

    if config.suite or config.ladder:
        raise UsageError(f"--runtime {config.runtime} times a --models sweep (not --suite, not --ladder)")
    check_spec({**_common(config), "compile": config.compile or ["off"], "runtime": config.runtime})
    missing = [m for m in ("onnx", "onnxscript", "onnxruntime") if importlib.util.find_spec(m) is None]
    if missing:
        raise UsageError(f'--runtime {config.runtime} needs {", ".join(missing)}: pip install -e ".[export]"')


@dataclasses.dataclass
class ModelsConfig(Config):
    """`linvit models`: which models to list, and what to count at which input side."""

    filter: str = ""
    macs: bool = False
    ops: bool = False
    macs_at: int = 224  # the square input side --macs and --ops count at
    json: bool = False


def run_models(config: ModelsConfig) -> None:
    """`linvit models`: registered models with parameter counts (GMACs with --macs, ATen ops with --ops).

    Without --macs / --ops the models are built on the meta device (shapes only), so listing is instant."""
    import timm

    from linvit import list_models

    names = list_models(model_filter(config.filter))
    if not names:
        raise UsageError(f"no model matches {config.filter!r}")
    rows, side = [], config.macs_at
    x = torch.zeros(1, 3, side, side)
    for name in names:
        measure = config.macs or config.ops
        with torch.device("cpu" if measure else "meta"):
            model = timm.create_model(name).eval()
        row = {"model": name, "params": sum(p.numel() for p in model.parameters())}
        with torch.no_grad():
            if config.macs:
                row[f"gmacs@{side}"] = round(count_flops(partial(model, x)) / 2e9, 3)
            if config.ops:
                model(x)  # warm-up
                row[f"ops@{side}"] = count_ops(partial(model, x)).total
        rows.append(row)
    if config.json:
        print(json.dumps(rows, indent=2))
        return
    print(models_table(rows))


def model_filter(text: str) -> str:
    """A plain word matches anywhere, case-insensitively ("Linear" -> "*linear*"); wildcards are kept."""
    text = text.lower()
    return text if any(c in text for c in "*?[") or not text else f"*{text}*"


def models_table(rows: list[dict]) -> str:
    """Aligned columns with a header row and units (params in millions)."""
    titles = {"model": "model", "params": "params (M)"}
    for key in rows[0]:
        if key.startswith("gmacs@"):
            titles[key] = f"GMACs @{key.split('@')[1]} px"
        elif key.startswith("ops@"):
            titles[key] = f"ATen ops @{key.split('@')[1]} px"
    cells = [[str(r["model"]), f"{r['params'] / 1e6:.2f}", *[f"{r[k]:,}" for k in list(titles)[2:]]] for r in rows]
    table = [list(titles.values()), *cells]
    widths = [max(len(row[i]) for row in table) for i in range(len(titles))]
    lines = [
        "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True)))
        for row in table
    ]
    return "\n".join(lines)
