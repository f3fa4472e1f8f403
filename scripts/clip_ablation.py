"""Does gradient clipping stop the training collapses of Linear-InfSA and pure InfSA? (reproduce's recipe)

`linvit reproduce --full` trains every family with one recipe that has no gradient clipping (DeiT's). Its val
curves show Linear-InfSA losing 26-31 points within one epoch after warm-up in 2 of 3 digit seeds, and
metrics.jsonl's grad_norm_max shows a gradient spike in the same epoch. This script trains the reproduce
protocol's exact runs (linvit.reproduce.plan) once without clipping and once with `--clip-grad C`, for each
family and seed, and compares them seed by seed (paired, 95% t-interval):

    python scripts/clip_ablation.py --publish docs      # train (resumable) into runs/clip-ablation, then publish
    python scripts/clip_ablation.py --report-only --publish docs

Writes OUT/ablation.json; --publish DOCS writes DOCS/sweeps/clip/{ablation.json, curves.png, commands.txt} and
the table between `<!-- clip:begin/end -->` in DOCS/results.md, all from the runs' metrics.jsonl.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

from linvit.reproduce.claims import interval
from linvit.reproduce.plan import RECIPES, TASKS, Planner, Stage
from linvit.reproduce.report import replace_between
from linvit.reproduce.stages import recorded_timings, run_stages
from linvit.reproduce.stats import mean_interval, paired_difference, verdict
from linvit_cli import run_command

BEGIN, END = "<!-- clip:begin -->", "<!-- clip:end -->"


def plan(
    out: str, tasks: list[str], families: list[str], seeds: list[int], clips: list[float], threads: int
) -> list[Stage]:
    """reproduce --full's training stage of each (task, family, seed), once per clip value (0 = none), on
    a fixed number of CPU threads (the float rounding, hence the run, depends on it)."""
    stages = []
    for clip in clips:
        planner = Planner(f"{out}/clip{clip:g}", "cpu", RECIPES["full"])
        for task in tasks:
            for family in families:
                for seed in seeds:
                    stage = planner.train(TASKS[task], family, seed)
                    argv = [*stage.argv, "--threads", str(threads)] + (["--clip-grad", str(clip)] if clip else [])
                    outputs = [f"clip{clip:g}/{path}" for path in stage.outputs]
                    info = {**stage.info, "clip": clip}
                    stages.append(Stage(f"clip{clip:g}/{stage.name}", argv, outputs, stage.est_s, info))
    return stages


def run_record(out: Path, stage: Stage) -> dict:
    """One run's curves from its metrics.jsonl: val top-1, gradient norms, and its worst one-epoch fall."""
    folder = out / Path(stage.outputs[0]).parent
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines() if line.strip()]
    val = [r["val_top1"] for r in rows]
    falls = [before - after for before, after in zip(val[:-1], val[1:], strict=True)]
    return {
        **stage.info,
        "val_curve": val,
        "grad_norm_curve": [r["grad_norm"] for r in rows],
        "grad_norm_max_curve": [r["grad_norm_max"] for r in rows],
        "final_val": val[-1],
        "largest_fall": max([0.0, *falls]),
        "train_seconds": sum(r["epoch_seconds"] for r in rows),
    }


def summarise(records: list[dict], clips: list[float]) -> list[dict]:
    """Per (task, family, clip): final val over seeds, and for clip > 0 its paired difference to no clipping."""
    rows = []
    groups = dict.fromkeys((r["task"], r["family"]) for r in records)  # in the order they ran
    for task, family in groups:
        by_clip = {c: {r["seed"]: r for r in records if (r["task"], r["family"], r["clip"]) == (task, family, c)}
                   for c in clips}  # fmt: skip
        for clip, runs in by_clip.items():
            if not runs:
                continue
            row = {"task": task, "family": family, "clip": clip, "seeds": sorted(runs)}
            row["final_val"] = mean_interval([runs[s]["final_val"] for s in sorted(runs)])  # values in seed order
            row["largest_fall"] = [runs[s]["largest_fall"] for s in sorted(runs)]
            row["grad_norm_max"] = [max(runs[s]["grad_norm_max_curve"]) for s in sorted(runs)]
            if clip and by_clip.get(0.0):
                finals = {s: r["final_val"] for s, r in runs.items()}
                base = {s: r["final_val"] for s, r in by_clip[0.0].items()}
                row["vs_no_clip"] = paired_difference(finals, base)
                row["verdict"] = verdict(row["vs_no_clip"])
            rows.append(row)
    return rows


def table(summary: dict) -> str:
    lines = [
        f"`linvit reproduce --full`'s training runs (14 epochs, AdamW lr 1e-3, batch 64, no augmentation), "
        f"seeds {', '.join(map(str, summary['seeds']))}, without gradient clipping (the protocol) and with "
        f'`--clip-grad`; final val top-1, mean [95% t-interval over seeds]; "largest fall" is the biggest drop '
        'of val top-1 from one epoch to the next, "max grad norm" the largest gradient norm before clipping '
        f"(per seed). Every run's `linvit train` command: [sweeps/clip/commands.txt](sweeps/clip/commands.txt); "
        f"this table: `{summary['command']}`.",
        "",
        "| task | family | clip | final val top-1 | per seed | largest fall per seed | max grad norm per seed "
        "| clip - none (paired) | clipping helps |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in summary["rows"]:
        diff = row.get("vs_no_clip")
        lines.append(
            f"| {row['task']} | {row['family']} | {row['clip']:g} | {interval(row['final_val'])} "
            f"| {', '.join(f'{v:.1f}' for v in row['final_val']['values'])} "
            f"| {', '.join(f'{v:.1f}' for v in row['largest_fall'])} "
            f"| {', '.join(f'{v:,.0f}' if v >= 100 else f'{v:.1f}' for v in row['grad_norm_max'])} "
            f"| {interval(diff) if diff else '-'} | {row.get('verdict', '-')} |"
        )
    return "\n".join(lines)


def curves_figure(records: list[dict], path: Path) -> None:
    """Per task and family: val top-1 (top) and the largest gradient norm per epoch (bottom, log) by clip value."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = list(dict.fromkeys((r["task"], r["family"]) for r in records))
    clips = sorted({r["clip"] for r in records})
    fig, axes = plt.subplots(2, len(panels), figsize=(3.2 * len(panels), 5.2), squeeze=False, sharex=True)
    for col, (task, family) in enumerate(panels):
        for r in (r for r in records if (r["task"], r["family"]) == (task, family)):
            colour = f"C{clips.index(r['clip'])}"
            label = f"clip {r['clip']:g}" if r["clip"] else "no clip"
            label = label if r["seed"] == min(x["seed"] for x in records) else None
            axes[0, col].plot(r["val_curve"], color=colour, lw=1.2, label=label)
            axes[1, col].semilogy(r["grad_norm_max_curve"], color=colour, lw=1.2)
        axes[0, col].set_title(f"{task} / {family}", fontsize=10)
        axes[1, col].set_xlabel("epoch")
    axes[0, 0].set_ylabel("val top-1 %")
    axes[1, 0].set_ylabel("max grad norm")
    axes[0, 0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def publish(out: Path, docs: Path, summary: dict) -> None:
    folder = docs / "sweeps" / "clip"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "ablation.json").write_text(json.dumps(summary, indent=1))
    curves_figure(summary["runs"], folder / "curves.png")
    shutil.copy(out / "commands.txt", folder / "commands.txt")
    block = f"{BEGIN}\n{table(summary)}\n\n![val top-1 and gradient norms per epoch](sweeps/clip/curves.png)\n{END}"
    replace_between(docs / "results.md", BEGIN, END, block)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="runs/clip-ablation")
    parser.add_argument("--tasks", default="digit", help="reproduce tasks, comma-separated (digit, max)")
    parser.add_argument("--families", default="softmax,pure,linear", help="reproduce families, comma-separated")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--clips", default="0,5", help="--clip-grad values; 0 = none (the protocol)")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads per run (run families in parallel)")
    parser.add_argument("--publish", default=None, help="docs folder for ablation.json, the figure and the table")
    parser.add_argument("--report-only", action="store_true", help="summarise the runs finished so far")
    args = parser.parse_args()
    out = Path(args.out)
    tasks, families = args.tasks.split(","), args.families.split(",")
    seeds, clips = [int(s) for s in args.seeds.split(",")], sorted({float(c) for c in args.clips.split(",")})
    stages = plan(str(out), tasks, families, seeds, clips, args.threads)
    if not args.report_only:
        run_stages(out, stages, run_command)
    finished = recorded_timings(out, stages)
    (out / "commands.txt").write_text("\n".join(t["command"] for t in finished.values()) + "\n")
    records = [run_record(out, s) for s in stages if s.name in finished]
    if not records:
        raise SystemExit("no run has finished yet: nothing to summarise")
    command = "python scripts/clip_ablation.py " + " ".join(sys.argv[1:])  # as it was typed
    summary = {"command": command, "seeds": seeds, "rows": summarise(records, clips), "runs": records}
    (out / "ablation.json").write_text(json.dumps(summary, indent=1))
    print(table(summary))
    if args.publish:
        publish(out, Path(args.publish), summary)


if __name__ == "__main__":
    main()
