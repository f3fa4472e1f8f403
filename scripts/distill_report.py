"""Tables and the figure of issue 36's evidence, from the summaries scripts/distill_experiment.py wrote
(called by its --publish; nothing here is typed by hand)."""

from __future__ import annotations

from pathlib import Path

NAMES = {
    "katz_infsa": "Katz-InfSA",
    "pure_infsa": "pure InfSA",
    "linear_infsa": "Linear-InfSA",
    "katz_infsa:hedgehog": "Katz-InfSA, `hedgehog` maps",
    "katz_rows:hedgehog": "Katz-InfSA, rows normalised (`katz_rows`), `hedgehog` maps",
    "linear_attention:hedgehog": "`adala` (linear attention, `hedgehog` maps)",
}
# a language model's linear attention with learned maps is LoLCATs' student form, without its sliding window
LANGUAGE_NAMES = {
    **NAMES,
    "linear_attention:hedgehog": "`lolcats` form without its window (linear attention, `hedgehog`)",
    "katz_infsa:hedgehog+w64": "Katz-InfSA, `hedgehog` maps, window 64",
    "linear_attention:hedgehog+w64": "`lolcats` (linear attention, `hedgehog` maps, window 64)",
    "katz_infsa:hedgehog+w64+transfer": "Katz-InfSA, `hedgehog` maps, window 64, attention transfer only",
}
LANGUAGE_PARTS = {
    "language": "the GPT-2 of the section above",
    "language512": "the same GPT-2 shape and text at 512 tokens of context",
}
ANCHOR = "linear_attention:hedgehog"  # the field's form that Katz's students are judged against (issue 44)
SHORT_NAMES = {
    "katz_infsa:hedgehog": "Katz-InfSA + hedgehog maps",
    "katz_rows:hedgehog": "katz_rows + hedgehog maps",
    ANCHOR: "adala: linear attn. + hedgehog",
}
# summary -> its figure, docs/distill
VISION_PARTS = {"vision": "retention.png", "vision_max": "retention_max.png", "vision64": "retention_64.png"}


def rounded(value: float, digits: int = 1) -> float:
    """To the tables' precision, never -0.0 (a change of -0.04 points prints as no change, not as a fall)."""
    return round(value, digits) + 0.0


def _interval(summary: dict, digits: int = 1, signed: bool = False) -> str:
    mean = f"{rounded(summary['mean'], digits):{'+' if signed else ''}.{digits}f}"
    if summary["low"] is None:
        return f"{mean} (n={summary['n']})"
    return f"{mean} [{rounded(summary['low'], digits):.{digits}f}, {rounded(summary['high'], digits):.{digits}f}]"


def vision_table(vision: dict) -> str:
    teacher = vision["teacher_val_top1"]
    seeds = ", ".join(str(s) for s in sorted(vision["teachers"]))
    methods = {r["method"] for r in vision["rows"]}
    caption = (
        f"Teachers: softmax ViT-4L on `{vision.get('task', 'digit')}` at {vision.get('tokens', 16)} tokens, 868 "
        "steps (the reproduce protocol), seeds "
        f"{seeds}: val top-1 {_interval(teacher)}. Students get budget x 868 steps in 3 epochs; the comparisons "
        "train the same steps. `distill`: Katz and pure InfSA spend 2 epochs on attention transfer "
        "(`--transfer-lr 2e-3`) and 1 end to end, Linear-InfSA 1 and 2 (`--transfer-lr 1e-3`), on the output MSE "
        "(`--transfer-loss mse`; `mse+xent` rows add the attention-weight loss). Means over seeds, "
        "95% intervals; retention is the student's val top-1 as a share of its own teacher's (%). `linvit distill` "
        "starts the converted layers at discount 0.5 for Katz-InfSA and 0.9 for the others "
        "(distillation.task.default_gamma)."
    )
    if "distill, 1 + 2 epochs" in methods:
        caption += " `distill, 1 + 2 epochs` is Linear-InfSA's recipe for Katz and pure InfSA."
    if any("gamma_init" in m for m in methods):
        caption += " The rows at the other first discount are the evidence for that choice."
    if any(r["mixer"] == ANCHOR for r in vision["rows"]):
        caption += (
            " Rows with `hedgehog` maps learn a feature map per head in attention transfer (layers.feature_maps), on"
            " Katz's recipe; `adala` is the anchor form, plain linear attention with the same learned maps"
            " (ViT-AdaLA's student; layers.linear_attention)."
        )
    if any(r["mixer"].startswith("katz_rows") for r in vision["rows"]):
        caption += (
            " `katz_rows` is Katz-InfSA with every query's row of its series divided by its sum (docs/spec/infsa.md"
            " section 4.0), the same parameters and recipe."
        )
    if "distill, f = 128" in methods:
        caption += " `f = 128` rows learn a map twice the head dim (`--feature-dim 128`: 256 features a head)."
    if "distill, maps at lr 1e-2" in methods:
        caption += (
            " `maps at lr 1e-2` rows train the learned maps alone at lr 1e-2 in attention transfer (`--map-lr 1e-2`),"
            " the rest of each layer at the recipe's 2e-3."
        )
    lines = [
        caption,
        "",
        "| budget | student | method | steps | val top-1 | retention (%) | vs teacher (points) |",
        "|---|---|---|---|---|---|---|",
    ]
    last = ("convert + fine-tune", "from scratch")  # after every distill recipe, in this order
    order = {
        m: (m in last, last.index(m) if m in last else 0, m != "distill", m)
        for m in {r["method"] for r in vision["rows"]}
    }
    rows = sorted(vision["rows"], key=lambda r: (r["budget"], list(NAMES).index(r["mixer"]), order[r["method"]]))
    for r in rows:
        steps = "/".join(str(s) for s in r["steps"])
        lines.append(
            f"| {r['budget']:.0%} | {NAMES[r['mixer']]} | {r['method']} | {steps} | {_interval(r['val_top1'])} "
            f"| {_interval(r['retention'])} | {_interval(r['vs_teacher'])} |"
        )
    return "\n".join(lines)


def goals(summaries: dict) -> str:
    """Issue 44's goals, judged from the tables' means at <= 10% of the teacher's steps: a Katz-InfSA student keeps
    >= 99% of its teacher on every task, each Katz form at least the anchor form's retention (`adala`), and the
    language student is within 2% of its teacher's loss."""
    lines = ["Goals (issue 44), judged from the tables' means:"]
    for part in VISION_PARTS:
        task = summaries.get(part, {}).get("task", "digit")
        rows = [r for r in summaries.get(part, {}).get("rows", []) if r["method"] == "distill" and r["budget"] <= 0.1]
        anchors = {r["budget"]: r for r in rows if r["mixer"] == ANCHOR}
        for r in sorted(rows, key=lambda r: (r["budget"], list(NAMES).index(r["mixer"]))):
            if not r["mixer"].startswith("katz"):  # katz_infsa and katz_rows
                continue
            met = "met" if r["retention"]["mean"] >= 99 else "missed"
            where = f"`{task}` at {summaries[part].get('tokens', 16)} tokens"
            line = f"- {where}, {NAMES[r['mixer']]} at {r['budget']:.0%}: retention {_interval(r['retention'])}: {met}"
            if r["budget"] in anchors:
                beats = "at least" if r["retention"]["mean"] >= anchors[r["budget"]]["retention"]["mean"] else "below"
                line += f"; {beats} the anchor `adala` ({anchors[r['budget']]['retention']['mean']:.1f}"
                line += f"; paired by teacher: {_interval(_paired_retention(r, anchors[r['budget']]))} points)"
            lines.append(line)
    for part in LANGUAGE_PARTS:
        context = summaries.get(part, {}).get("context", 128)
        for r in summaries.get(part, {}).get("rows", []):
            met = "met" if r["loss_gap"]["mean"] <= 2 else "missed"
            gap = _interval(r["loss_gap"], 2)
            lines.append(f"- language ({context} tokens), {LANGUAGE_NAMES[r['mixer']]} at 10%: loss gap {gap}%: {met}")
    return "\n".join(lines)


def row_seeds(row: dict) -> list[int]:
    """The seeds of a summary row's values, in their order (rows before "seeds" was written list them under
    vs_teacher)."""
    return row["seeds"] if "seeds" in row else row["vs_teacher"]["seeds"]


def _paired_retention(row: dict, anchor: dict) -> dict:
    """The student's retention minus the anchor's, seed by seed (the same teacher), with its 95% interval."""
    return _paired(row, anchor, "retention")


def _paired(row: dict, other: dict, field: str) -> dict:
    """row's field minus other's, seed by seed (the same teacher), with its 95% interval."""
    from linvit.reproduce.stats import paired_difference

    def by_seed(r: dict) -> dict[int, float]:
        return dict(zip(row_seeds(r), r[field]["values"], strict=True))

    return paired_difference(by_seed(row), by_seed(other))


def write_section(doc, begin: str, end: str, text: str, source) -> None:
    """docs' generated section between the markers, from the JSON at source; says what it wrote."""
    from linvit.reproduce.report import replace_between

    replace_between(doc, begin, end, f"{begin}\n{text}\n{end}")
    print(f"{doc}: the table from {source}")


def distill_runs_arguments(parser, seeds: list[int]) -> None:
    """The experiment scripts' shared flags: the teacher seeds, where the runs are, --report-only."""
    parser.add_argument("--seeds", type=int, nargs="+", default=seeds, help=f"teacher seeds (default {seeds})")
    parser.add_argument("--out", default="runs/distill", help="where the teachers' and students' runs are")
    parser.add_argument("--report-only", action="store_true", help="the table from the committed JSON")


ROWS_BEGIN, ROWS_END = "<!-- katz-rows:begin -->", "<!-- katz-rows:end -->"
# the katz_rows comparison's methods, in its table's order: Katz's recipe, with the weight loss beside, with a
# learned map twice the head dim, and started at a tenth of a discount
ROWS_METHODS = (
    "distill",
    "distill, mse+xent",
    "distill, f = 128",
    "distill, gamma_init 0.1",
    "distill, maps at lr 1e-2",
)
NO_DISCOUNT = ("distill, gamma_init 0.1",)  # the anchor has no discount: its `distill` run is its run of these


def rows_table(comparison: dict) -> str:
    """katz_rows beside Katz-InfSA with the same maps and the anchor, per task on one set of teachers (10% of the
    teachers' steps, Katz's recipe; the recipe alone at the other budgets measured), each form's retention also
    paired with the anchor's by teacher."""
    lines = [
        "Generated by `python scripts/distill_experiment.py --report-only --publish docs` from "
        "docs/distill/katz_rows.json: each task's three students distil the same three teachers (seeds 0-2) at 10% of "
        "their steps (`distill at 5%` and `at 25%`: that share) on Katz's recipe (`distill`), and where measured "
        "with Hedgehog's attention-weight loss beside "
        "the output MSE (`distill, mse+xent`), started at discount 0.1 (`distill, gamma_init 0.1`), or with a "
        "learned map of f = 128 features, twice the head dim, on the "
        "output MSE (`distill, f = 128`), or with the learned maps alone at lr 1e-2 in attention transfer, the rest "
        "of each layer at 2e-3 (`distill, maps at lr 1e-2`). Teachers marked retrained are the protocol's command run "
        "again on another machine, which trains other teachers than that task's table above: the code is the same (one "
        "machine retrains seed 0 bit for bit at the data fix's commit and today), the float rounding of another "
        "CPU kind is not (docs/reproduce.md). Every row of a task shares its teachers, and each is paired seed by "
        "seed with the anchor trained the same way (its `distill` run for a first discount, which it does not "
        "have; in points of retention) and every changed recipe with the same form's `distill` run of its teacher "
        "(in points of val top-1).",
        "",
        "| task | teachers' val top-1 | student | method | val top-1 | retention (%) "
        "| minus the anchor's (same method), paired (points) | minus the same form's `distill`, paired (val top-1 "
        "points) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for part in comparison.values():
        anchors = {(r["method"], r["budget"]): r for r in part["rows"] if r["mixer"] == ANCHOR}
        recipes = {(r["mixer"], r["budget"]): r for r in part["rows"] if r["method"] == "distill"}
        teachers = _interval(part["teacher_val_top1"]) + (" (retrained)" if part["retrained"] else "")
        for r in sorted(part["rows"], key=_rows_order):
            anchor = anchors.get(("distill" if r["method"] in NO_DISCOUNT else r["method"], r["budget"]))
            recipe = recipes.get((r["mixer"], r["budget"]))
            paired = "-" if anchor is None or r["mixer"] == ANCHOR else _interval(_paired_retention(r, anchor))
            changed = "-" if recipe is None or r is recipe else _interval(_paired(r, recipe, "val_top1"), signed=True)
            where, student = f"`{part['task']}` at {part['tokens']} tokens", NAMES[r["mixer"]]
            lines.append(
                f"| {where} | {teachers} | {student} | {_method_at(r)} | {_interval(r['val_top1'])} "
                f"| {_interval(r['retention'])} | {paired} | {changed} |"
            )
    return "\n".join(lines)


def _rows_order(row: dict) -> tuple[bool, float, int, int]:
    """The 10% rows first, then the other budgets in order; by method (ROWS_METHODS' order), then by student
    (NAMES')."""
    methods = list(ROWS_METHODS)
    method = methods.index(row["method"]) if row["method"] in methods else len(methods)
    return row["budget"] != 0.1, row["budget"], method, list(NAMES).index(row["mixer"])


def _method_at(row: dict) -> str:
    """The method, with its budget where it is not the table's 10%."""
    return row["method"] if row["budget"] == 0.1 else f"{row['method']} at {row['budget']:.0%}"


def language_table(language: dict, teacher: str) -> str:
    context, batch = language.get("context", 128), language.get("batch", 32)
    steps, start = language["teacher_steps"], language.get("teacher_start")
    trained = f"{steps} steps of {batch} windows of {context} bytes"
    if start:  # scripts/distill_experiment.py's long_context_start
        trained = (
            f"the {start['context']}-token teacher ({start['steps']} steps) with its learned position table copied "
            f"to {context} rows (Longformer's extension), then {trained} (the same bytes a step); students distil it "
            f"in 10% of these {steps} steps, {10 * steps / (steps + start['steps']):.0f}% of all its steps"
        )
    else:
        trained += "; students distil it in 10% of its steps"
    lines = [
        f"Teacher: {teacher}, {trained} (1/3 attention transfer, 2/3 end to end; `attention transfer only`: all "
        "of them). "
        "Loss in nats per byte on the validation text; loss gap: the student's loss above the teacher's (%), means "
        "over distillation seeds with 95% intervals; `after transfer`: the gap at the end of attention transfer.",
        "",
        "| student | steps | val loss | teacher val loss | loss gap (%) | after transfer (%) |",
        "|---|---|---|---|---|---|",
    ]
    for r in language["rows"]:
        transfer = _interval(r["transfer_loss_gap"], 2) if r.get("transfer_loss_gap") else "-"
        lines.append(
            f"| {LANGUAGE_NAMES[r['mixer']]} | {r['steps']} | {_interval(r['val_loss'], 3)} "
            f"| {_interval(r['teacher_val_loss'], 3)} | {_interval(r['loss_gap'], 2)} | {transfer} |"
        )
    paired = _language_pairs(language["rows"])
    return "\n".join([*lines, *(["", paired] if paired else [])])


# (first, second): the windowed rows compared seed by seed, where both were run with their seeds recorded
LANGUAGE_PAIRS = (
    ("katz_infsa:hedgehog+w64", "linear_attention:hedgehog+w64"),
    ("katz_infsa:hedgehog+w64+transfer", "katz_infsa:hedgehog+w64"),
    ("katz_infsa:hedgehog+w64+transfer", "linear_attention:hedgehog+w64"),
)


def _language_pairs(rows: list[dict]) -> str:
    """One line of paired loss-gap differences (the same teacher, seed by seed) between the windowed students."""
    by_mixer = {r["mixer"]: r for r in rows if "seeds" in r}
    found = []
    for a, b in LANGUAGE_PAIRS:
        if a in by_mixer and b in by_mixer:
            difference = _paired(by_mixer[a], by_mixer[b], "loss_gap")
            found.append(f"{LANGUAGE_NAMES[a]} minus {LANGUAGE_NAMES[b]} {_interval(difference, 3, signed=True)}")
    return "Paired over seeds (loss gap, points, 95% intervals): " + "; ".join(found) + "." if found else ""


def timing_table(timing: dict) -> str:
    lines = [
        f"{timing['model']}, one CPU thread, batch 1: decode tokens/s after a prompt of each length (the mean of 32 "
        "greedy steps) and the bytes the cache holds then.",
        "",
        "| context | softmax tokens/s | causal Katz tokens/s | softmax cache (MiB) | causal Katz cache (MiB) |",
        "|---|---|---|---|---|",
    ]
    by = {(r["model"], r["context"]): r for r in timing["rows"]}
    for context in sorted({r["context"] for r in timing["rows"]}):
        s, k = by[("softmax", context)], by[("katz_infsa", context)]
        lines.append(
            f"| {context} | {s['tokens_per_second']:.0f} | {k['tokens_per_second']:.0f} "
            f"| {s['cache_bytes'] / 2**20:.2f} | {k['cache_bytes'] / 2**20:.3f} |"
        )
    return "\n".join(lines)


def tables(summaries: dict) -> str:
    parts = [
        "Generated by `python scripts/distill_experiment.py --report-only --publish docs` from docs/distill/*.json."
    ]
    for part, figure_name in VISION_PARTS.items():
        if part in summaries:
            task = summaries[part].get("task", "digit")
            tokens = summaries[part].get("tokens", 16)
            title = f"### Vision: the reproduce protocol's softmax ViT-4L on `{task}` at {tokens} tokens"
            parts += [title, vision_table(summaries[part])]
            parts.append(f"![retention against budget on {task} at {tokens} tokens](distill/{figure_name})")
    for part, teacher in LANGUAGE_PARTS.items():
        if part in summaries:
            context = summaries[part].get("context", 128)
            parts += [f"### Language: {teacher} ({context} tokens)", language_table(summaries[part], teacher)]
    parts.append(goals(summaries))
    if "timing" in summaries:
        parts += ["### Decoding: softmax's KV cache against causal Katz's state", timing_table(summaries["timing"])]
    return "\n\n".join(parts)


def _retention_points(rows: list[dict]) -> tuple[list[float], list[float], list[list[float]]]:
    """Budgets (%), mean retention and its 95% interval as error-bar lengths (none for a single seed)."""
    x = [100 * r["budget"] for r in rows]
    mean = [r["retention"]["mean"] for r in rows]
    low = [r["retention"]["low"] if r["retention"]["low"] is not None else m for r, m in zip(rows, mean, strict=True)]
    high = [
        r["retention"]["high"] if r["retention"]["high"] is not None else m for r, m in zip(rows, mean, strict=True)
    ]
    return (
        x,
        mean,
        [[m - lo for m, lo in zip(mean, low, strict=True)], [h - m for m, h in zip(mean, high, strict=True)]],
    )


def figure(vision: dict, path: Path) -> None:
    """Retention against budget, one panel per student mixer, one line per method (mean and interval)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    mixers = [m for m in NAMES if any(r["mixer"] == m for r in vision["rows"])]
    fig, axes = plt.subplots(1, len(mixers), figsize=(4 * len(mixers), 3.2), sharey=True, squeeze=False)
    styles = (("distill", "o-"), ("convert + fine-tune", "s--"), ("from scratch", "^:"))
    for ax, mixer in zip(axes[0], mixers, strict=True):
        budgets = set()
        for dodge, (method, style) in zip((-0.5, 0.0, 0.5), styles, strict=True):  # side by side at one budget
            rows = sorted((r for r in vision["rows"] if (r["mixer"], r["method"]) == (mixer, method)),
                          key=lambda r: r["budget"])  # fmt: skip
            if rows:
                x, mean, spread = _retention_points(rows)
                budgets |= set(x)
                ax.errorbar([b + dodge for b in x], mean, yerr=spread, fmt=style, capsize=3, label=method)
        ax.axhline(99, color="grey", lw=0.8, ls="--", label="goal: 99%")
        ax.set_xticks(sorted(budgets))
        ax.set_title(SHORT_NAMES.get(mixer, f"student: {NAMES[mixer]}"), fontsize=10)
        ax.set_xlabel("% of the teacher's training steps")
    axes[0][0].set_ylabel("val top-1, % of the teacher's")
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
