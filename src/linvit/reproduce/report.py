"""OUT/report.json (every number, from linvit.reproduce.collect), OUT/report.md (one table per paper's claims,
each with its computed verdict, then every model per task) and the figures, all from the stages' outputs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from .claims import TASK_SETTING, claims, interval, signed
from .collect import collect
from .figures import curves_figure, erf_figure, learning_curves_figure, maps_figure, scaling_figure
from .plan import Recipe, Stage


def replace_between(path: Path, begin: str, end: str, section: str) -> None:
    """Replace the text of a generated docs section from begin to end (markers included; section carries them
    again), so that tables in hand-written pages come from a command's JSON; a page without them is an error."""
    text = path.read_text()
    if begin not in text or end not in text:
        raise SystemExit(f"{path}: no {begin} ... {end} markers to replace")
    head, rest = text.split(begin, 1)
    path.write_text(head + section + rest.split(end, 1)[1])


def _row(cells: list) -> str:
    return "| " + " | ".join(str(c).replace("|", "\\|").replace("\n", " ") for c in cells) + " |"


def header(report: dict) -> list[str]:
    env, r = report["environment"], report["recipe"]
    where = env.get("gpu") or f"{env['cpu_cores']} CPU cores"
    return [
        f"# linvit reproduce ({report['mode']})",
        "",
        f"linvit {env['linvit']}, torch {env['torch']}, timm {env['timm']}, Python {env['python']}, {where} "
        f"({env['torch_threads']} torch threads). All stages: {report['seconds_all_stages'] / 60:.1f} min "
        f"(this invocation: {report['seconds_this_run'] / 60:.1f} min; reused stages count their first run).",
        "",
        f"Protocol: every family at width {r['width']} and {r['depth']} blocks, trained from scratch with one recipe "
        f"(AdamW, lr {r['lr']:g}, batch {r['batch']}, {r['epochs']} epochs of freshly drawn canvases, no other "
        "augmentation), chosen on the softmax baseline's validation curve only (docs/sweeps/digits); seeds "
        f"{', '.join(map(str, r['seeds']))}. Numbers are means with 95% Student-t intervals over seeds (one seed: "
        "the mean alone, and every comparison is inconclusive); differences are paired by seed. The test and shifted "
        "sets were fixed before any model was trained and chose nothing. Small-scale checks of the papers' "
        "mechanisms, not replications of their ImageNet numbers.",
    ]


def claim_tables(report: dict) -> list[str]:
    tasks = "; ".join(f"task `{t}`: {TASK_SETTING[t]}" for t in report["recipe"]["tasks"])
    lines = [
        "",
        f"Settings of every row below: {tasks}. Accuracies are top-1 (%) on the test set unless the claim "
        "says shift (the shifted test set); map scores x100.",
    ]
    for title, rows in report["claims"].items():
        lines += ["", f"## {title}", "", "| claim | paper | linvit | verdict | command |", "|---|---|---|---|---|"]
        lines += [
            _row([c["claim"], c["paper"], c["ours"], f"**{c['verdict']}** ({c['rule']})", f"`{c['command']}`"])
            for c in rows
        ]
    return lines


def model_tables(report: dict) -> list[str]:
    """Per task: accuracy on val / test / shifted with intervals, the difference to softmax, the plateau count."""
    lines = []
    for task, families in report["runs"].items():
        lines += ["", f"## Every model: task `{task}` ({TASK_SETTING[task]})", ""]
        lines += [
            "| family | model | params | val top-1 | test top-1 | shifted top-1 | test vs softmax | "
            "shifted vs softmax | flat last quarter | train min |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for family, e in families.items():
            s, d = e["summary"], e["vs_baseline"]
            minutes = np.mean([x["train_seconds"] for x in e["seeds"].values()]) / 60
            lines.append(
                _row(
                    [
                        family,
                        f"`{e['model']}`",
                        f"{e['params'] / 1e6:.2f}M",
                        interval(s.get("val")),
                        interval(s.get("test")),
                        interval(s.get("shifted")),
                        signed(d.get("test")),
                        signed(d.get("shifted")),
                        f"{e['plateaus']}/{len(e['seeds'])}",
                        f"{minutes:.1f}",
                    ]
                )
            )
    return lines


def analysis_table(report: dict) -> list[str]:
    """Maps, spectra and ERFs on the first task's trained models."""
    task = report["recipe"]["tasks"][0]
    families = report["runs"].get(task, {})
    lines = ["", f"## Maps, spectra, receptive fields (task `{task}`, val images, x100 where a share)", ""]
    lines += [
        "| family | map | box ROC-AUC | box PR-AUC | MoRF-AOC | LeRF-AOC | pointing | spectral cosine | "
        "ERF outside centre |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for family, e in families.items():
        s = e["summary"]
        method = next((x["maps"]["method"] for x in e["seeds"].values() if "maps" in x), "-")
        cells = [family, method] + [interval(s.get(k), 100) for k in ("box_roc_auc", "box_pr_auc", "morf_aoc")]
        cells += [interval(s.get(k), 100) for k in ("lerf_aoc", "pointing_game")]
        cells += [interval(s.get("spectral_cosine"), digits=3), interval(s.get("erf_outside_centre"), 100)]
        lines.append(_row(cells))
    return lines


def lr_table(report: dict) -> list[str]:
    """Seed 0's val top-1 per family and learning rate (keys are numbers, or strings once read from JSON)."""
    sweep = {family: {float(lr): v for lr, v in s["val"].items()} for family, s in report["lr_sweep"].items()}
    lrs = sorted({lr for values in sweep.values() for lr in values})
    if len(lrs) < 2:
        return []
    lines = ["", "## Per-family learning rate (seed 0, first task, val top-1; the shared recipe stays the protocol)"]
    lines += ["", "| family | " + " | ".join(f"lr {lr:g}" for lr in lrs) + " | best |", "|---" * (len(lrs) + 2) + "|"]
    for family, values in sweep.items():
        best = max(values, key=values.get)
        cells = [family] + [f"{values[lr]:.1f}" if lr in values else "-" for lr in lrs]
        lines.append(_row(cells + [f"{values[best]:.1f} at {best:g}"]))
    return lines


def markdown(report: dict, figures: list[str]) -> str:
    lines = header(report) + claim_tables(report) + model_tables(report) + analysis_table(report)
    lines += lr_table(report)
    lines += ["", "## Figures", ""] + [f"![{name}]({name}.png)\n" for name in figures]
    if report["stages_missing"]:
        lines += ["", f"## Not run yet ({len(report['stages_missing'])} stages)", ""]
        lines += [", ".join(f"`{name}`" for name in report["stages_missing"])]
    lines += [
        "",
        "## Commands",
        "",
        "Every stage, in order (also `commands.sh`); re-running `linvit reproduce` with the same --output reuses "
        f"finished stages. Recipe: `{json.dumps(report['recipe'])}`.",
        "",
        "<details><summary>all commands</summary>",
        "",
        "```bash",
        *report["commands"].values(),
        "```",
        "",
        "</details>",
        "",
    ]
    return "\n".join(lines)


def draw_figures(out: Path, report: dict) -> list[str]:
    """The figures whose stages have run; returns their names."""
    drawn = []
    runs = report["runs"]
    if runs:
        learning_curves_figure(runs, out / "curves.png")
        drawn.append("curves")
    task = report["recipe"]["tasks"][0]
    first = {f: (e, min(e["seeds"])) for f, e in runs.get(task, {}).items()}
    mapped = {f: s for f, (e, s) in first.items() if "maps" in e["seeds"][s]}
    if mapped:
        folder = {f: out / "explain" / task / f / f"s{s}" for f, s in mapped.items()}
        examples = {f: dict(np.load(folder[f] / "maps.npz")) for f in mapped}
        labels = {f: f"{f}\n({first[f][0]['seeds'][s]['maps']['method']})" for f, s in mapped.items()}
        maps_figure(examples, labels, out / "maps.png")
        curves_figure({f: first[f][0]["seeds"][s]["maps"] for f, s in mapped.items()}, out / "deletion.png")
        drawn += ["maps", "deletion"]
    erf = {f: s for f, (e, s) in first.items() if "erf_outside_centre" in e["seeds"][s]}
    if erf:
        arrays = {f: np.load(out / "erf" / task / f / f"s{s}" / "erf.npy") for f, s in erf.items()}
        erf_figure(arrays, {f: first[f][0]["seeds"][s]["erf_outside_centre"] for f, s in erf.items()}, out / "erf.png")
        drawn.append("erf")
    bench = report["bench"]
    if bench["family4l"] and bench["weightformer"]:
        scaling_figure(bench["family4l"]["points"], bench["weightformer"]["points"], out / "scaling.png")
        drawn.append("scaling")
    return drawn


def write_report(out: Path, stages: list[Stage], timings: dict, mode: str, device: str, recipe: Recipe) -> dict:
    """report.json, report.md, commands.sh and the figures into ``out``, from the stages that finished."""
    report = collect(out, stages, timings, mode, device, recipe)
    report["claims"] = claims(report)
    report["figures"] = draw_figures(out, report)
    (out / "report.json").write_text(json.dumps(report, indent=2, default=str))
    (out / "report.md").write_text(markdown(report, report["figures"]))
    (out / "commands.sh").write_text("#!/usr/bin/env bash\nset -e\n" + "\n".join(report["commands"].values()) + "\n")
    return report
