"""Issue 26's results: every DiT mixer trained with one recipe on the embedded digits, with seeds, scored offline.

    python scripts/generate_results.py                  # train, sample, score into runs/generate-results (resumable)
    python scripts/generate_results.py --publish docs   # ... and write docs/generate/ and docs/results.md's table
    python scripts/generate_results.py --report-only --publish docs   # only what has finished so far
    python scripts/generate_results.py --mixers softmax,pure,katz      # a share of the mixers (one process each)

Every step is a `linvit` command run as a stage of `linvit reproduce` (printed, resumable: a finished stage
is reused, an interrupted training continues from its last.pth). The stages: a softmax classifier on the
same digits (the recipe `linvit reproduce` uses, at 28 px), then per mixer and seed `linvit generate train`
with RECIPE and `linvit generate score`, and one `linvit generate sample` grid per mixer. `--publish DOCS`
writes DOCS/generate/{results.json, samples.png} and the table between `<!-- generate:begin/end -->` in
DOCS/results.md, all from the stages' JSON.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

from linvit.reproduce.claims import interval
from linvit.reproduce.plan import Stage
from linvit.reproduce.report import replace_between
from linvit.reproduce.stages import recorded_timings, run_stages
from linvit.reproduce.stats import mean_interval
from linvit_cli import run_command

MIXERS = ("softmax", "weightformer", "pure", "linear", "katz")
DATA = "digits:digit,canvas=28,clutter=0"  # centred digits, as MNIST draws them (49 tokens at patch 4)
CLASSIFIER = [
    "train", "--model", "vit_4l_patch16_224", "--data", DATA, "--img-size", "28", "--crop-pct", "1.0",
    "--seed", "0", "--epochs", "14", "--batch-size", "64", "--lr", "0.001", "--warmup-epochs", "1",
    "--drop-path", "0", "--aa", "none", "--mixup", "0", "--cutmix", "0", "--reprob", "0", "--smoothing", "0",
    "--scale", "1", "1", "--ratio", "1", "1", "--hflip", "0", "--workers", "0", "--device", "cpu",
    "--resume", "auto", "--no-progress", "--model-kwargs", "patch_size=7", "embed_dim=192", "depth=4", "num_heads=3",
]  # fmt: skip
# the one recipe of every mixer: `generate train`'s defaults but lr 2e-3 at batch 32, chosen on the softmax DiT
# alone: `linvit generate train --data DATA --epochs 20` ends at val loss 0.077 with the defaults (1e-3 / 64)
# and 0.066 with these flags
RECIPE = ["--lr", "2e-3", "--batch-size", "32"]
BEGIN, END = "<!-- generate:begin -->", "<!-- generate:end -->"


def plan(out: str, seeds: list[int], epochs: int, mixers=MIXERS) -> list[Stage]:
    """The classifier, then train + score per (mixer, seed), then a grid per mixer (its first seed)."""
    classifier = [*CLASSIFIER, "--output", f"{out}/classifier"]
    stages = [Stage("classifier", classifier, ["classifier/model.safetensors"], 200)]
    for mixer in mixers:
        for seed in seeds:
            run = f"runs/{mixer}/s{seed}"
            argv = ["generate", "train", "--data", DATA, "--mixer", mixer, "--epochs", str(epochs), "--seed", str(seed)]
            argv += RECIPE
            argv += ["--output", f"{out}/{run}", "--workers", "0", "--device", "cpu", "--resume", "auto"]
            argv += ["--no-progress"]
            stages.append(Stage(f"train/{mixer}/s{seed}", argv, [f"{run}/model.safetensors"], 16 * epochs))
            argv = ["generate", "score", "--checkpoint", f"{out}/{run}", "--classifier", f"{out}/classifier"]
            argv += ["--num", "500", "--device", "cpu", "--no-progress", "--json", f"{out}/scores/{mixer}_s{seed}.json"]
            inputs = [f"{run}/model.safetensors", "classifier/model.safetensors"]  # retrained: scored again
            stages.append(Stage(f"score/{mixer}/s{seed}", argv, [f"scores/{mixer}_s{seed}.json"], 60, {}, inputs))
        argv = ["generate", "sample", "--checkpoint", f"{out}/runs/{mixer}/s{seeds[0]}", "--num", "40"]
        argv += ["--device", "cpu", "--no-progress", "--output", f"{out}/grids/{mixer}.png"]
        weights = [f"runs/{mixer}/s{seeds[0]}/model.safetensors"]
        stages.append(Stage(f"sample/{mixer}", argv, [f"grids/{mixer}.png"], 10, {}, weights))
    return stages


def summarise(out: Path, seeds: list[int], epochs: int, done: set[str]) -> dict:
    """Per mixer: class accuracy and Frechet distance over seeds (mean, 95% t-interval), final val loss,
    training seconds per epoch and sampling images per second (as the runs measured them, with whatever else
    ran on the machine: speed comparisons come from `linvit bench --suite generate`), from the runs' JSON.
    Only mixers whose stages are all in done (finished for this very plan) count: files an older recipe
    left in OUT are never reported."""
    mixers, missing = {}, []
    for mixer in MIXERS:
        names = [f"{kind}/{mixer}/s{s}" for kind in ("train", "score") for s in seeds] + [f"sample/{mixer}"]
        if not set(names) <= done:
            missing.append(mixer)
            continue
        scores = [json.loads((out / f"scores/{mixer}_s{s}.json").read_text()) for s in seeds]
        curves = [_metrics(out / f"runs/{mixer}/s{s}") for s in seeds]
        mixers[mixer] = {
            "class_accuracy": mean_interval([r["class_accuracy"] for r in scores]),
            "class_accuracy_samples": samples_interval(scores),
            "frechet_distance": mean_interval([r["frechet_distance"] for r in scores]),
            "val_loss": mean_interval([c[-1]["val_loss"] for c in curves]),
            "epoch_seconds": mean_interval([sum(e["epoch_seconds"] for e in c) / len(c) for c in curves]),
            "sample_images_per_second": mean_interval([r["samples"] / r["sampling_seconds"] for r in scores]),
        }
    if not mixers:
        raise SystemExit("no mixer has finished training, scoring and its grid yet: nothing to summarise")
    reference = ("samples", "steps", "guidance", "real_class_accuracy", "real_frechet_distance")
    first = json.loads((out / f"scores/{next(iter(mixers))}_s{seeds[0]}.json").read_text())
    return {
        "data": DATA,
        "seeds": seeds,
        "epochs": epochs,
        "recipe": "linvit generate train defaults (DiT-tiny, patch 4, AdamW, EMA 0.999) with lr 2e-3 at batch 32",
        "score": {k: first[k] for k in reference},
        "mixers": mixers,
        "not_run": missing,
    }


def samples_interval(scores: list[dict]) -> dict:
    """Class accuracy over all seeds' samples pooled, with its 95% Wilson interval: how far from chance the
    share is, given how many samples were judged (the uncertainty of the scoring, not of the training)."""
    from scipy.stats import binomtest

    total = sum(r["samples"] for r in scores)
    correct = round(sum(r["class_accuracy"] * r["samples"] for r in scores))
    ci = binomtest(correct, total).proportion_ci(0.95, method="wilson")
    return {"correct": correct, "samples": total, "mean": correct / total, "low": ci.low, "high": ci.high}


def _metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]


def table(summary: dict) -> str:
    """The markdown table of summarise()'s numbers (percent for accuracy, intervals over seeds)."""
    score = summary["score"]
    lines = [
        f"DiT-tiny per mixer on `{summary['data']}` (28 x 28 grey, patch 4: 49 tokens), {summary['epochs']} epochs, "
        f"seeds {', '.join(map(str, summary['seeds']))}; mean [95% t-interval over seeds]. "
        f"Scored on {score['samples']} samples ({score['steps']} DDIM steps, guidance {score['guidance']}) by a "
        f"softmax classifier that gets {100 * score['real_class_accuracy']:.1f}% of real val digits right; two real "
        f"sets (val vs test) lie {score['real_frechet_distance']:.2f} apart in its features. Chance is 10%; the "
        "samples' interval is the 95% Wilson interval of the class accuracy over every seed's samples pooled. "
        f"CPU budget: {summary.get('stage_minutes', 0):.0f} min of wall time in the finished stages (classifier, "
        "training, scoring, grids) on a 2-core machine, at times shared with other work.",
        "",
        "| mixer | class accuracy % | per seed % | samples' 95% interval % | Frechet distance | final val loss |",
        "|---|---|---|---|---|---|",
    ]
    if summary.get("not_run"):
        lines[0] += f" Not run yet (the stages stopped before them): {', '.join(summary['not_run'])}."
    for mixer, row in summary["mixers"].items():
        lines.append(
            f"| {mixer} | {interval(row['class_accuracy'], 100)} "
            f"| {', '.join(f'{100 * v:.1f}' for v in row['class_accuracy']['values'])} "
            f"| {interval(row['class_accuracy_samples'], 100)} "
            f"| {interval(row['frechet_distance'], digits=2)} "
            f"| {interval(row['val_loss'], digits=4)} |"
        )
    return "\n".join(lines)


def publish(out: Path, docs: Path, summary: dict) -> None:
    folder = docs / "generate"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "results.json").write_text(json.dumps(summary, indent=2))
    samples_figure(out, folder / "samples.png", list(summary["mixers"]))
    block = f"{BEGIN}\n{table(summary)}\n\n![samples per mixer](generate/samples.png)\n{END}"
    replace_between(docs / "results.md", BEGIN, END, block)
    shutil.copy(out / "commands.txt", folder / "commands.txt")


def samples_figure(out: Path, path: Path, mixers: list[str]) -> None:
    """One panel per mixer: its grid (columns are classes 0-9, four samples each)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(mixers), figsize=(3.2 * len(mixers), 1.7), squeeze=False)
    for ax, mixer in zip(axes[0], mixers, strict=True):
        ax.imshow(plt.imread(out / f"grids/{mixer}.png"), cmap="gray")
        ax.set_title(mixer, fontsize=10)
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="runs/generate-results")
    parser.add_argument("--seeds", default="0,1,2", help="training seeds, comma-separated")
    parser.add_argument("--epochs", type=int, default=80)
    parser.add_argument("--mixers", default=",".join(MIXERS), help="mixers to run (empty: the classifier only)")
    parser.add_argument("--publish", default=None, help="docs folder to write results.json, figure and table into")
    parser.add_argument("--report-only", action="store_true", help="summarise the stages finished so far")
    args = parser.parse_args()
    out, seeds = Path(args.out), [int(s) for s in args.seeds.split(",")]
    mixers = [m for m in args.mixers.split(",") if m]  # none: the classifier alone
    if set(mixers) - set(MIXERS):
        parser.error(f"--mixers: choose from {', '.join(MIXERS)}")
    if not args.report_only:
        run_stages(out, plan(str(out), seeds, args.epochs, mixers), run_command)
    finished = recorded_timings(out, plan(str(out), seeds, args.epochs))  # every mixer's, whichever process ran it
    (out / "commands.txt").write_text("\n".join(t["command"] for t in finished.values()) + "\n")
    summary = summarise(out, seeds, args.epochs, set(finished))
    summary["stage_minutes"] = sum(t["seconds"] or 0 for t in finished.values()) / 60
    (out / "results.json").write_text(json.dumps(summary, indent=2))
    print(table(summary))
    if args.publish:
        publish(out, Path(args.publish), summary)


if __name__ == "__main__":
    main()
