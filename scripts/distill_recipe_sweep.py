"""Issue 44's 64-token goal (retention >= 99%): one change at a time to the recipe of the best students.

The 64-token table of docs/results.md distils with Katz's recipe (2 epochs of attention transfer at lr 2e-3, 1
end to end at lr 1e-4, output MSE plus Hedgehog's attention-weight loss: `distill, mse+xent`). Here each variant
changes one thing of that recipe -- a rate (the maps' own too), the stage split, the learned map's size, the first
discount or its own rate, the end-to-end loss; two rows join the changes that raised the Katz student (one with
the learned discount too) -- for the Katz student that keeps most (katz_rows:hedgehog) and, where given, the
anchor form (linear_attention:hedgehog), on the same 64-token teachers (scripts/distill_experiment.py --part vision
--task digit64 trains them) and the same 10% budget.
Each variant's runs are paired seed by seed with the recipe's own run (OUT/vision64/distill_transfer_xent, the
table's runs, made here if missing). Resumable stage by stage; writes docs/distill/recipe_sweep64.json and its
table in docs/results.md:

    python scripts/distill_recipe_sweep.py                        # seed 0, every variant (about 25 CPU minutes)
    python scripts/distill_recipe_sweep.py --seeds 0 1 2 --variants feature_dim_128
    python scripts/distill_recipe_sweep.py --report-only          # the table from the committed JSON
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from distill_experiment import (
    PARTS,
    VARIANTS,
    VISION_TASKS,
    finished_top1s,
    last_metrics,
    stage,
    students_data,
    transfer_heavy_argv,
)
from distill_report import distill_runs_arguments, rounded, write_section
from safetensors.torch import load_file as safetensors_load

from linvit.reproduce.stages import run_stages
from linvit.reproduce.stats import mean_interval, paired_difference
from linvit_cli import run_command

ROOT = Path(__file__).resolve().parents[1]
FILE = ROOT / "docs" / "distill" / "recipe_sweep64.json"
DOC = ROOT / "docs" / "results.md"
BEGIN, END = "<!-- recipe-sweep:begin -->", "<!-- recipe-sweep:end -->"
TASK, BUDGET, BASE = "digit64", 0.10, "distill_transfer_xent"  # the recipe varied: Katz's, with mse+xent
FORMS = {"katz_rows:hedgehog": "`katz_rows`, `hedgehog` maps", "linear_attention:hedgehog": "`adala` (the anchor)"}
ANCHOR = "linear_attention:hedgehog"
# name -> (what it changes, the flags added to the recipe's; the last of a repeated flag wins)
SWEEP = {
    "transfer_lr_1e-3": ("attention transfer at lr 1e-3 (not 2e-3)", ["--transfer-lr", "1e-3"]),
    "transfer_lr_1e-2": ("attention transfer at lr 1e-2 (LoLCATs' rate for its maps)", ["--transfer-lr", "1e-2"]),
    "lr_3e-4": ("end to end at lr 3e-4 (not 1e-4)", ["--lr", "3e-4"]),
    "lr_1e-3": ("end to end at lr 1e-3 (the teacher's)", ["--lr", "1e-3"]),
    "split_1_2": ("1 epoch of transfer, 2 end to end (not 2 + 1)", ["--transfer-epochs", "1", "--epochs", "2"]),
    "transfer_only": ("3 epochs of transfer, none end to end", ["--stages", "attention", "--transfer-epochs", "3"]),
    "feature_dim_128": ("feature size f = 128, twice the head dim (256 features a head)", ["--feature-dim", "128"]),
    # LoLCATs' rate for its maps, given to the maps alone (the rest of each converted layer stays at 2e-3)
    "map_lr_1e-2": (
        "learned maps alone at lr 1e-2 in attention transfer (--map-lr; the rest at 2e-3)",
        ["--map-lr", "1e-2"],
    ),
    # the two changes that raised `katz_rows` on the mean, together (not one change: a row of its own)
    "map_lr_1e-2+f128": (
        "both the maps alone at lr 1e-2 and f = 128 (the two rows above together)",
        ["--map-lr", "1e-2", "--feature-dim", "128"],
    ),
    # the discount barely trains in 87 steps (0.5 -> 0.49 in every head of the recipe's students): where it starts
    # sets how much weight the hops past the first get (the anchor is the first hop alone, row-normalised)
    "gamma_0.25": ("first discount 0.25 (not 0.5): hops past the first weigh less", ["--gamma-init", "0.25"]),
    "gamma_0.1": ("first discount 0.1 (not 0.5): little weight past the first hop", ["--gamma-init", "0.1"]),
    # the anchor is katz_rows' gamma -> 0 limit (outputs within 5e-4 of it at 0.01, float64): the same form run
    # next to the anchor, so whatever gap remains at 0.01 is not the hops' (training noise, or the code)
    "gamma_0.01": (
        "first discount 0.01 (not 0.5): the anchor's limit, hops past the first ~1%",
        ["--gamma-init", "0.01"],
    ),
    # the discount learned, not chosen: its logit at a rate that lets it leave its start in 58 transfer steps (Adam
    # moves theta by about the rate a step), so each head weighs its own hops past the first
    "gamma_lr_3e-2": (
        "the discounts learned at lr 3e-2 in attention transfer (--gamma-lr; the rest at 2e-3)",
        ["--gamma-lr", "3e-2"],
    ),
    "gamma_lr_1e-1": (
        "the discounts learned at lr 1e-1 in attention transfer (--gamma-lr; the rest at 2e-3)",
        ["--gamma-lr", "1e-1"],
    ),
    # the learned discount with the two changes that raised `katz_rows` (the anchor's best is f = 128)
    "gamma_lr_1e-1+map_lr_1e-2+f128": (
        "the discounts learned at lr 1e-1, the maps alone at lr 1e-2 and f = 128 (three rows above together)",
        ["--gamma-lr", "1e-1", "--map-lr", "1e-2", "--feature-dim", "128"],
    ),
    # the end-to-end stage's loss (the teacher's logits, KL at temperature 1): ViT-AdaLA's feature alignment, the
    # labels, a softer target
    "feature_weight_1": ("end to end also fits each layer's output (--feature-weight 1)", ["--feature-weight", "1"]),
    "hard_weight_0.5": ("end to end half on the labels (--hard-weight 0.5)", ["--hard-weight", "0.5"]),
    "temperature_2": ("end to end at temperature 2 (not 1)", ["--temperature", "2"]),
}


def stages(out: Path, seeds: list[int], forms: list[str], variants: list[str]) -> list:
    """The recipe's own runs (the 64-token table's folder), then every variant's, seed by seed."""
    task, part = VISION_TASKS[TASK], f"{out}/{PARTS[TASK]}"
    data = students_data(task, BUDGET)
    found = []
    for seed in seeds:
        teacher = f"{part}/runs/{task.name}/softmax/s{seed}"
        for mixer in forms:
            recipe = transfer_heavy_argv(teacher, data, mixer, seed, VARIANTS[BASE][1])
            info = {"mixer": mixer, "seed": seed, "budget": BUDGET}
            found.append(stage(f"{BASE}/{mixer}/b{BUDGET:g}/s{seed}", part, recipe, {**info, "method": "recipe"}))
            for name in variants:
                argv, method = recipe + SWEEP[name][1], f"sweep {name}"
                found.append(stage(f"sweep/{name}/{mixer}/s{seed}", part, argv, {**info, "method": method}))
    return found


def summary(out: Path) -> dict:
    """Per form and variant: val top-1 and retention over the seeds run, and the paired change against the
    recipe's own run of each seed (points of val top-1)."""
    part = out / PARTS[TASK]
    teachers, rows = {}, []
    for seed in range(3):
        metrics = part / f"runs/{VISION_TASKS[TASK].name}/softmax/s{seed}/metrics.jsonl"
        if metrics.is_file():
            teachers[seed] = last_metrics(metrics)["val_top1"]
    for mixer in FORMS:
        base = finished_top1s(part, f"{BASE}/{mixer}/b{BUDGET:g}", teachers)
        for name in ["recipe", *SWEEP]:
            val = base if name == "recipe" else finished_top1s(part, f"sweep/{name}/{mixer}", teachers)
            if not val:
                continue
            retention = {s: 100 * v / teachers[s] for s, v in val.items()}
            paired = {s: base[s] for s in val if s in base}
            rows.append(
                {
                    "form": mixer,
                    "variant": name,
                    "seeds": list(val),
                    "val_top1": list(val.values()),
                    "retention": mean_interval(list(retention.values())),
                    "vs_recipe": None if name == "recipe" else paired_difference(val, paired),
                    "vs_anchor": _vs_anchor(part, teachers, mixer, name, val),
                    "discounts": _discounts(
                        part, f"{BASE}/{mixer}/b{BUDGET:g}" if name == "recipe" else f"sweep/{name}/{mixer}", val
                    ),
                }
            )
    return {"task": TASK, "budget": BUDGET, "teachers": teachers, "rows": rows}


def _vs_anchor(part: Path, teachers: dict, mixer: str, variant: str, val: dict) -> dict | None:
    """val against the anchor's run of the same variant, seed by seed, less any discount change (the anchor has
    no discount: its recipe, or its run of the other changes joined with one); None for the anchor itself or a
    variant it did not run."""
    if mixer == ANCHOR:
        return None
    same = "+".join(change for change in variant.split("+") if not change.startswith("gamma_")) or "recipe"
    folder = f"{BASE}/{ANCHOR}/b{BUDGET:g}" if same == "recipe" else f"sweep/{same}/{ANCHOR}"
    anchor = finished_top1s(part, folder, teachers)
    return paired_difference(val, anchor) if set(val) & set(anchor) else None


def _discounts(part: Path, folder: str, seeds) -> dict | None:
    """The students' per-head discounts gamma = sigmoid(theta) at the end (every layer, every seed run): where
    a learned discount went, and that a chosen one stayed; None for a form without one."""
    gammas = []
    for seed in seeds:
        weights = safetensors_load(part / folder / f"s{seed}" / "model.safetensors")
        gammas += [torch.sigmoid(v.double()) for k, v in weights.items() if k.endswith("theta")]  # .theta, .infsa_theta
    if not gammas:
        return None
    every = torch.cat(gammas)
    return {"min": every.min().item(), "mean": every.mean().item(), "max": every.max().item(), "heads": len(every)}


def table(data: dict) -> str:
    """The markdown block between the markers."""
    teachers = ", ".join(f"{v:g}" for v in data["teachers"].values())
    lines = [
        f"Generated by `python scripts/distill_recipe_sweep.py` from docs/distill/recipe_sweep64.json: the 64-token "
        f"teachers (seeds {', '.join(map(str, data['teachers']))}: val top-1 {teachers}), {data['budget']:.0%} of "
        "their steps. `recipe`: the table's `distill, mse+xent` (Katz's recipe with the attention-weight loss); "
        "every other row changes one thing of it (two rows join several, and say so). Retention: mean over the seeds "
        "run, with its 95% interval where "
        "there are several; `vs recipe`: the change of val top-1 against the recipe's own run of each seed "
        "(points, paired); `vs the anchor`: the same against the anchor form's run of each seed with the same "
        "change, less a change of the discount, where it starts or its own rate (it has none); `discounts at "
        "the end`: the students' gamma over every head, layer and seed run, mean (min-max).",
        "",
        "| student | variant | seeds | val top-1 per seed | retention (%) | vs recipe (points) "
        "| vs the anchor (points, paired) | discounts at the end |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in data["rows"]:
        what = "recipe" if row["variant"] == "recipe" else SWEEP[row["variant"]][0]
        values = ", ".join(f"{v:.1f}" for v in row["val_top1"])
        lines.append(
            f"| {FORMS[row['form']]} | {what} | {len(row['seeds'])} | {values} | {_interval(row['retention'])} "
            f"| {_interval(row['vs_recipe'], signed=True)} | {_interval(row.get('vs_anchor'), signed=True)} "
            f"| {_discount_range(row.get('discounts'))} |"
        )
    return "\n".join(lines)


def _discount_range(stat: dict | None) -> str:
    if stat is None:
        return "-"
    return f"{stat['mean']:.2f} ({stat['min']:.2f}-{stat['max']:.2f})"


def _interval(stat: dict | None, signed: bool = False) -> str:
    if stat is None:
        return "-"
    fmt = "{:+.1f}" if signed else "{:.1f}"
    mean = rounded(stat["mean"])
    if stat["n"] < 2 or rounded(stat["low"]) == rounded(stat["high"]):  # one seed, or one change on every seed
        return fmt.format(mean)
    return f"{fmt.format(mean)} [{rounded(stat['low']):.1f}, {rounded(stat['high']):.1f}]"


def publish(data: dict) -> None:
    FILE.write_text(json.dumps(data, indent=2) + "\n")
    write_section(DOC, BEGIN, END, table(data), FILE)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    distill_runs_arguments(p, [0])
    p.add_argument("--forms", nargs="+", choices=list(FORMS), default=["katz_rows:hedgehog"])
    p.add_argument("--variants", nargs="+", choices=list(SWEEP), default=list(SWEEP))
    args = p.parse_args()
    if args.report_only:
        write_section(DOC, BEGIN, END, table(json.loads(FILE.read_text())), FILE)
        return
    torch.set_num_threads(1)  # as distill_experiment runs its students
    out = Path(args.out)
    run_stages(out / PARTS[TASK], stages(out, sorted(args.seeds), args.forms, args.variants), run_command)
    publish(_merged(summary(out)))


def _merged(found: dict) -> dict:
    """This checkout's runs with the committed file's rows: for each row the one over more seeds, where the
    teachers both have agree (a checkout that trained fewer teachers keeps the committed rows over more seeds);
    teachers that differ (another CPU kind, docs/reproduce.md) make this checkout's runs the table."""
    if not FILE.is_file():
        return found
    earlier = json.loads(FILE.read_text())
    committed = {int(s): v for s, v in earlier["teachers"].items()}
    if any(committed.get(seed, v) != v for seed, v in found["teachers"].items()):
        return found
    rows = {(r["form"], r["variant"]): r for r in earlier["rows"]}
    if not _same_recipe_runs(rows, found["rows"]):  # variants are paired with the recipe rows they sit beside
        return found
    for row in found["rows"]:
        key = (row["form"], row["variant"])
        if key not in rows or len(row["seeds"]) >= len(rows[key]["seeds"]):
            rows[key] = row
    order = [(f, v) for f in FORMS for v in ["recipe", *SWEEP]]
    return {**found, "teachers": committed | found["teachers"], "rows": [rows[k] for k in order if k in rows]}


def _same_recipe_runs(committed: dict, rows: list[dict]) -> bool:
    """This checkout's recipe runs give the committed recipe rows' val top-1 on every seed both have."""
    for row in rows:
        earlier = committed.get((row["form"], "recipe"))
        if row["variant"] == "recipe" and earlier is not None:
            mine = dict(zip(row["seeds"], row["val_top1"], strict=True))
            theirs = dict(zip(earlier["seeds"], earlier["val_top1"], strict=True))
            if any(theirs[s] != v for s, v in mine.items() if s in theirs):
                return False
    return True


if __name__ == "__main__":
    assert VARIANTS[BASE][1] == ["--transfer-loss", "mse+xent"], "the recipe varied is Katz's with mse+xent"
    main()
