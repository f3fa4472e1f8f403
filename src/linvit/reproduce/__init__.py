"""`linvit reproduce`: digit tasks -> every family, task and seed trained and evaluated -> maps, spectra, ERFs ->
learning-rate sweep -> benchmarks -> report with intervals and verdicts."""

from __future__ import annotations

from collections.abc import Callable

from ..errors import UsageError
from ..utils.paths import output_dir
from .plan import FAMILIES, RECIPES, Recipe, Stage, build_plan
from .report import write_report
from .stages import recorded_timings, run_stages

__all__ = ["run_reproduce", "build_plan", "run_stages", "write_report", "FAMILIES", "RECIPES", "Recipe", "Stage"]


def run_reproduce(args, execute: Callable[[list[str]], None], recipe: Recipe | None = None) -> dict:
    """Run (or continue) every stage into args.out, then write the report; ``recipe`` overrides the mode's.

    ``execute`` runs one `linvit` command line (the stage's argv) in this process and raises on failure,
    so a failed stage is not marked done; the CLI passes its own dispatcher.
    """
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise UsageError("--device cuda requested but torch sees no CUDA device")
    mode = "quick" if args.quick else "full"
    out = output_dir(args.out)
    recipe = recipe or RECIPES[mode]
    stages = build_plan(str(out), mode, args.device, recipe)
    if getattr(args, "report_only", False):
        timings = recorded_timings(out, stages)
    else:
        timings = run_stages(out, stages, execute)
    report = write_report(out, stages, timings, mode, args.device, recipe)
    figures = ", ".join(f"{name}.png" for name in report["figures"])
    missing = f"; {len(report['stages_missing'])} stages not run yet" if report["stages_missing"] else ""
    print(
        f"wrote {out}/report.md, report.json, commands.sh, {figures} "
        f"({report['seconds_this_run'] / 60:.1f} min this run{missing})"
    )
    return report
