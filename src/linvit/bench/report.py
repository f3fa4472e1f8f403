"""Benchmark outputs: JSON, CSV, a Markdown table, the log-log scaling figure and exponent fits."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import numpy as np

from ..utils.paths import output_dir

COLUMNS = [
    "model",
    "res",
    "tokens",
    "batch",
    "compile",
    "mode",
    "device",
    "dtype",
    "status",
    "latency_ms",
    "latency_iqr_ms",
    "images_per_s",
    "peak_mem_mb",
    "peak_total_mb",
    "gflops",
    "gflops_per_s",
    "energy_j_per_img",
    "compile_s",
    "gemm_peak_gflops_per_s",
    "peak_share",
    "threads",
    "cpu_model",
    "reason",
]


def series_label(record: dict) -> str:
    """The line a point belongs to: the model, plus its batch and compile mode when not the defaults."""
    label = record["model"]
    if record.get("batch", 1) != 1:
        label += f" b{record['batch']}"
    if record.get("compile", "off") != "off":
        label += f" [{record['compile']}]"
    if record.get("runtime", "eager") != "eager":
        label += f" ({record['runtime']})"
    return label


def fit_exponent(tokens: list[float], latency: list[float]) -> float | None:
    """Slope of log(latency) against log(tokens) (least squares); None with fewer than two points."""
    pts = [(t, y) for t, y in zip(tokens, latency, strict=True) if t and y and t > 0 and y > 0]
    if len({t for t, _ in pts}) < 2:
        return None
    x, y = np.log([p[0] for p in pts]), np.log([p[1] for p in pts])
    return float(np.polyfit(x, y, 1)[0])


def exponents(records: list[dict]) -> dict[str, float | None]:
    """Fitted latency-vs-tokens exponent per model over its successful points."""
    out = {}
    for label in dict.fromkeys(series_label(r) for r in records):
        ok = [r for r in records if series_label(r) == label and r["status"] == "ok"]
        out[label] = fit_exponent([r["tokens"] for r in ok], [r["latency_ms"] for r in ok])
    return out


def _fmt(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 100 else f"{value:,.0f}"
    return str(value)


def _speedup(record: dict, records: list[dict], reference: str | None) -> float | None:
    """reference latency / this latency at the same resolution, batch and compile mode (None if either failed)."""
    if reference is None or record["status"] != "ok":
        return None
    same = ("res", "batch", "compile")
    ref = [
        r
        for r in records
        if r["model"] == reference and r["status"] == "ok" and all(r.get(k) == record.get(k) for k in same)
    ]
    return ref[0]["latency_ms"] / record["latency_ms"] if ref else None


def markdown_table(records: list[dict], references: list[str] | None = None) -> str:
    """One row per point with latency, throughput, memory, GFLOPs, status (and speed-up vs each reference)."""
    references = references or []
    head = ["model", "res", "tokens", "status", "latency ms (IQR)", "img/s", "peak MB", "GFLOPs", "GFLOP/s", "J/img"]
    defaults = {"batch": 1, "compile": "off", "runtime": "eager"}
    varied = [k for k in defaults if len({r.get(k, defaults[k]) for r in records}) > 1]
    head[1:1] = varied
    if any(r.get("compile_s") for r in records):
        head.append("compile s")
    shares = any(r.get("peak_share") is not None for r in records)
    if shares:
        head.append("share of GEMM peak")
    head += [f"speed-up vs `{ref}`" for ref in references]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in records:
        ok = r["status"] == "ok"
        status = r["status"] if ok else f"{r['status']}: {r.get('reason') or ''}"
        latency = f"{r['latency_ms']:.1f} ({r['latency_iqr_ms']:.1f})" if ok else "-"
        cells = [f"`{r['model']}`", *(r.get(k) for k in varied), r["res"], r.get("tokens"), status, latency]
        cells += [r.get(k) if ok else None for k in ("images_per_s", "peak_mem_mb", "gflops", "gflops_per_s")]
        cells.append(r.get("energy_j_per_img"))
        if "compile s" in head:
            cells.append(r.get("compile_s"))
        if shares:
            cells.append(None if r.get("peak_share") is None else f"{r['peak_share']:.0%}")
        for ref in references:
            speedup = _speedup(r, records, ref)
            cells.append(None if speedup is None else f"{speedup:.2f}x")
        lines.append("| " + " | ".join(_fmt(c) for c in cells) + " |")
    return "\n".join(lines)


def plot_lines(axes, records: list[dict]) -> None:
    """Latency (axes[0]) and, when given, peak memory (axes[1]) against tokens, log-log, one line per model."""
    from matplotlib.ticker import NullFormatter

    for model, slope in exponents(records).items():
        ok = [r for r in records if series_label(r) == model and r["status"] == "ok"]
        ok = sorted(ok, key=lambda r: r["tokens"])
        if not ok:
            continue
        label = model if slope is None else f"{model} (slope {slope:.2f})"
        tokens = [r["tokens"] for r in ok]
        axes[0].plot(tokens, [r["latency_ms"] for r in ok], marker="o", label=label)
        if len(axes) > 1:
            axes[1].plot(tokens, [max(r["peak_mem_mb"], 1e-3) for r in ok], marker="o", label=model)
    for ax, ylabel in zip(axes, ("latency per batch (ms)", "peak memory above idle (MB)"), strict=False):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.xaxis.set_minor_formatter(NullFormatter())  # minor labels of a log axis overlap
        ax.set_xlabel("tokens")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)
    if axes[0].get_legend_handles_labels()[0]:  # nothing to label when every point failed
        axes[0].legend(fontsize=7)


def plot_scaling(records: list[dict], path: Path) -> None:
    """Latency and peak memory against tokens, log-log, one line per model."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    plot_lines(axes, records)
    first = records[0] if records else {}
    batches = ", ".join(str(b) for b in dict.fromkeys(r.get("batch") for r in records))
    fig.suptitle(f"linvit bench: {first.get('mode')} on {first.get('device')}, {first.get('dtype')}, batch {batches}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_outputs(
    records: list[dict], out: Path, extra: dict | None = None, references: list[str] | None = None
) -> dict[str, float | None]:
    """Write bench.json, bench.csv, bench.md and scaling.png into out; returns the exponents."""
    out = output_dir(out)
    slopes = exponents(records)
    (out / "bench.json").write_text(json.dumps({"points": records, "exponents": slopes, **(extra or {})}, indent=2))
    with open(out / "bench.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(records)
    lines = [markdown_table(records, references), "", "| model | latency exponent vs tokens |", "|---|---|"]
    if (extra or {}).get("machine"):
        lines[:0] = [machine_line(extra["machine"]), ""]
    lines += [f"| `{m}` | {'-' if s is None or math.isnan(s) else f'{s:.3f}'} |" for m, s in slopes.items()]
    (out / "bench.md").write_text("\n".join(lines) + "\n")
    plot_scaling(records, out / "scaling.png")
    return slopes


def machine_line(machine: dict) -> str:
    """The machine record in one line: CPU (or GPU), matrix extensions, threads, GEMM peak per dtype."""
    if machine.get("status") != "ok":
        return f"machine: GEMM peak not measured ({machine.get('status')}: {machine.get('reason')})"
    extensions = ", ".join(machine.get("cpu_extensions") or []) or "none listed"
    peaks = ", ".join(f"{d} {g['gflops_per_s']:,.0f}" for d, g in machine["gemm"].items())
    cpu = machine["cpu_model"] + (f" ({machine['cpu_id']})" if machine.get("cpu_id") else "")
    return (
        f"machine: {machine['device_name']} ({machine['device']}); CPU {cpu}, matrix extensions: {extensions}; "
        f"{machine['threads']} thread(s); GEMM peak GFLOP/s: {peaks}"
    )


SHARE_BEGIN, SHARE_END = "<!-- gemm-share:begin -->", "<!-- gemm-share:end -->"


def shares_section(runs: dict[str, dict]) -> str:
    """docs/benchmarks.md's share table between its markers, from `linvit bench` JSON per dtype ({dtype: bench.json
    content}): per model, each dtype's latency, achieved GFLOP/s and share of that dtype's GEMM peak, measured in the
    same run; the machine, threads, settings and note from the records."""
    dtypes = list(runs)
    rows = list(dict.fromkeys((p["model"], p["res"]) for run in runs.values() for p in run["points"]))
    head = ["model @ res"] + [f"{d} {col}" for d in dtypes for col in ("ms", "GFLOP/s", "share of GEMM peak")]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for model, res in rows:
        points = {
            d: next((p for p in runs[d]["points"] if (p["model"], p["res"]) == (model, res)), None) for d in dtypes
        }
        cells = [f"`{model}` @ {res}"]
        for p in points.values():
            if not p or p["status"] != "ok":
                cells += [p["status"] if p else "-", "-", "-"]
                continue
            share = "-" if p.get("peak_share") is None else f"{p['peak_share']:.0%}"
            cells += [f"{p['latency_ms']:,.0f}", _fmt(p.get("gflops_per_s")), share]
        lines.append("| " + " | ".join(cells) + " |")
    notes = [""]
    for dtype, run in runs.items():
        notes.append(
            f"- {dtype}: {machine_line(run.get('machine') or {})}; `{run.get('script') or run.get('command')}`"
        )
        if run.get("note"):
            notes.append(f"  {run['note']}")
    return "\n".join([SHARE_BEGIN, *lines, *notes, SHARE_END])
