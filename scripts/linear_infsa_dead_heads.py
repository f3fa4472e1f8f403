"""Why Linear-InfSA stays at the majority class on `max`: its heads die.

Linear-InfSA's importance is a_j = r_j / (sum_l r_l + eps) with r_j = ReLU(q_bar . k~_j), one soft query q_bar
per (image, head). Where q_bar . k~_j <= 0 for every token, the head's importance is all zero: its slice of the
pooled value is zero for that image, and it passes no gradient to its scores, so nothing in that head's own
parameters is pushed to revive it (only changes elsewhere, in the layers below, can). This script trains
reproduce's Linear-InfSA runs on `digit` and `max` (`linvit reproduce --full`'s exact `linvit train` commands,
on one thread, in this process) and records, with PyTorch's global hooks only (linear_infsa_spikes.Recorder),
per optimizer step and layer the share of (image, head) pairs whose importance is all zero, and per head the
share of images where it is.

    python scripts/linear_infsa_dead_heads.py --publish docs        # 6 runs, ~25 min on 1 CPU thread
    python scripts/linear_infsa_dead_heads.py --tasks max --seeds 0  # one run

Writes OUT/<task>/s<seed>/steps.json (per step), OUT/summary.json and OUT/dead_heads.png; --publish DOCS copies
the last two to DOCS/sweeps/dead_heads/ and rewrites its section of DOCS/results.md.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

from linear_infsa_spikes import record_training  # a sibling script: the same hooks

from linvit.reproduce.plan import RECIPES, TASKS, Planner
from linvit.reproduce.report import replace_between

BEGIN, END = "<!-- dead-heads:begin -->", "<!-- dead-heads:end -->"
DEAD = 0.99  # a head is dead in an epoch when its importance is all zero for at least this share of images


def epoch_means(steps: list[dict], per_epoch: int) -> list[dict]:
    """Per epoch: the share of dead (image, head) pairs over all layers, and which heads were dead (layer, head)."""
    epochs = []
    for start in range(0, len(steps), per_epoch):
        chunk = [s for s in steps[start : start + per_epoch] if s["layers"]]
        by_head = [  # [layer][head]: the share of the epoch's images for which that head is dead
            [
                sum(s["layers"][i]["dead_by_head"][h] for s in chunk) / len(chunk)
                for h in range(len(layer["dead_by_head"]))
            ]
            for i, layer in enumerate(chunk[0]["layers"])
        ]
        epochs.append(
            {
                "dead_share": sum(sum(row) for row in by_head) / sum(len(row) for row in by_head),
                "dead_heads": [[i, h] for i, row in enumerate(by_head) for h, v in enumerate(row) if v >= DEAD],
            }
        )
    return epochs


def summarise_run(steps: list[dict], per_epoch: int, metrics: list[dict]) -> dict:
    first = steps[0]["layers"]  # the first forward: the initial weights
    epochs = epoch_means(steps, per_epoch)
    heads = sum(len(layer["dead_by_head"]) for layer in first)
    return {
        "heads": heads,
        "dead_share_at_init": sum(x["dead_share"] for x in first) / len(first),
        "dead_heads_at_init": sum(v >= DEAD for x in first for v in x["dead_by_head"]),
        "epochs": epochs,
        "val_top1": [m["val_top1"] for m in metrics],
        "train_loss": [m["train_loss"] for m in metrics],
    }


def train_runs(out: Path, tasks: list[str], seeds: list[int]) -> dict:
    """Train (or reuse the steps.json of) every (task, seed); the per-run summaries."""
    runs = {}
    for task in tasks:
        for seed in seeds:
            folder = out / task / f"s{seed}"
            stage = Planner(str(folder), "cpu", RECIPES["full"]).train(TASKS[task], "linear", seed)
            argv = [*stage.argv, "--threads", "1"]
            if not (folder / "steps.json").exists():
                shutil.rmtree(folder / "runs", ignore_errors=True)  # every step from the start, never a resume
                steps = record_training(argv)
                (folder / "steps.json").write_text(json.dumps(steps))
            steps = json.loads((folder / "steps.json").read_text())
            metrics = [json.loads(x) for x in (folder / stage.outputs[1]).read_text().splitlines() if x.strip()]
            runs[f"{task}/s{seed}"] = {
                "command": "linvit " + " ".join(argv),
                **summarise_run(steps, len(steps) // RECIPES["full"].epochs, metrics),
            }
    return runs


def figure(runs: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.4), sharex=True)
    for name, run in runs.items():
        color = "C3" if name.startswith("max") else "C0"
        x = range(len(run["epochs"]) + 1)
        axes[0].plot(x, [100 * run["dead_share_at_init"]] + [100 * e["dead_share"] for e in run["epochs"]], color=color)
        axes[1].plot(x, [run["dead_heads_at_init"]] + [len(e["dead_heads"]) for e in run["epochs"]], color=color)
    axes[0].set_ylabel("(image, head) pairs with\nall-zero importance, %")
    axes[1].set_ylabel(f"heads dead for >= {DEAD:.0%} of images")
    for ax in axes:
        ax.set_xlabel("epoch (0: initial weights)")
    axes[0].plot([], [], color="C0", label="digit")
    axes[0].plot([], [], color="C3", label="max")
    axes[0].legend(frameon=False)
    fig.suptitle("Linear-InfSA, reproduce's runs (one line per seed): heads die on max, not on digit")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def section(runs: dict) -> str:
    """docs/results.md's text and table, from summary.json."""
    heads = next(iter(runs.values()))["heads"]
    lines = [
        f"Linear-InfSA's dead heads in reproduce's runs (4 layers x 3 heads = {heads}), recorded per training step by "
        "`python scripts/linear_infsa_dead_heads.py --publish docs` (global hooks; the runs are reproduce's "
        '`linvit train` commands unchanged, on one thread). "Dead share" is the share of (image, head) pairs '
        "of the epoch's training batches whose importance is all zero; a head counts as dead when that holds for "
        f"at least {DEAD:.0%} of its images.",
        "",
        "| task | seed | dead share at init | after epoch 1 | last epoch | dead heads at init | last epoch | "
        "final val top-1 | train loss, first -> last epoch |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, run in runs.items():
        task, seed = name.split("/")
        epochs = run["epochs"]
        lines.append(
            f"| {task} | {seed[1:]} | {100 * run['dead_share_at_init']:.0f}% | {100 * epochs[0]['dead_share']:.0f}% "
            f"| {100 * epochs[-1]['dead_share']:.0f}% | {run['dead_heads_at_init']} | {len(epochs[-1]['dead_heads'])} "
            f"| {run['val_top1'][-1]:g} | {run['train_loss'][0]:.2f} -> {run['train_loss'][-1]:.2f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="runs/linear-dead-heads")
    parser.add_argument("--tasks", default="digit,max")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--publish", default=None, help="docs folder: DOCS/sweeps/dead_heads/ and DOCS/results.md")
    args = parser.parse_args()
    out = Path(args.out)
    runs = train_runs(out, args.tasks.split(","), [int(s) for s in args.seeds.split(",")])
    (out / "summary.json").write_text(json.dumps(runs, indent=1))
    figure(runs, out / "dead_heads.png")
    print(section(runs))
    if args.publish:
        folder = Path(args.publish) / "sweeps" / "dead_heads"
        folder.mkdir(parents=True, exist_ok=True)
        for name in ("summary.json", "dead_heads.png"):
            shutil.copy(out / name, folder / name)
        block = f"{BEGIN}\n{section(runs)}\n\n![dead heads per epoch](sweeps/dead_heads/dead_heads.png)\n{END}"
        replace_between(Path(args.publish) / "results.md", BEGIN, END, block)


if __name__ == "__main__":
    main()
