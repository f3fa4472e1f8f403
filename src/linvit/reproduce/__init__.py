"""`linvit reproduce`: digit tasks -> every family, task and seed trained and evaluated -> maps, spectra, ERFs ->
learning-rate sweep -> benchmarks -> report with intervals and verdicts."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from ..config import Config
from ..errors import UsageError
from ..utils.paths import output_dir
from .plan import FAMILIES, RECIPES, Recipe, Stage, build_plan
from .report import write_report
from .stages import recorded_timings, run_stages

__all__ = [
    "run_reproduce",
    "ReproduceConfig",
    "build_plan",
    "run_stages",
    "write_report",
    "FAMILIES",
    "RECIPES",
    "Recipe",
    "Stage",
]


@dataclasses.dataclass
class ReproduceConfig(Config):
    """`linvit reproduce`: the quick recipe or the full one (the default), where, and on which device; device
    defaults to cpu (the recorded reports' numbers), auto is cuda when torch sees one."""

    quick: bool = False
    full: bool = False
    report_only: bool = False  # run nothing: the report from the stages already finished in output
    device: str = "cpu"
    output: str | None = None  # re-running with the same folder reuses finished stages


def _device(device: str) -> str:
    """cpu or cuda: auto picks cuda when torch sees one; cuda without one is a one-line error."""
    if device == "cpu":
        return device
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda requested but torch sees no CUDA device")
    return "cuda" if torch.cuda.is_available() else "cpu"


def run_reproduce(
    config: ReproduceConfig, execute: Callable[[list[str]], None] | None, recipe: Recipe | None = None
) -> dict:
    """Run (or continue) every stage into config.output, then write the report; ``recipe`` overrides the mode's.

    ``execute`` runs one `linvit` command line (the stage's argv) in this process and raises on failure,
    so a failed stage is not marked done; the CLI passes its own dispatcher.
    """
    if not config.output:
        raise UsageError("give --output DIR")
    device = _device(config.device)
    mode = "quick" if config.quick else "full"
    out = output_dir(config.output)
    recipe = recipe or RECIPES[mode]
    stages = build_plan(str(out), mode, device, recipe)
    if config.report_only:
        timings = recorded_timings(out, stages)
    else:
        timings = run_stages(out, stages, execute)
    report = write_report(out, stages, timings, mode, device, recipe)
    figures = ", ".join(f"{name}.png" for name in report["figures"])
    missing = f"; {len(report['stages_missing'])} stages not run yet" if report["stages_missing"] else ""
    print(
        f"wrote {out}/report.md, report.json, commands.sh, {figures} "
        f"({report['seconds_this_run'] / 60:.1f} min this run{missing})"
    )
    return report
