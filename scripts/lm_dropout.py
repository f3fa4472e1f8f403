"""Issue 45.6: does the converted attention's dropout matter when a causal language model is distilled?

Softmax drops attention probabilities; a converted linear or Katz layer never forms them (O(N)), so it drops
its output rows instead, at the teacher's rate (GPT-2: attn_pdrop = 0.1). This distils docs/results.md's GPT-2
teacher (scripts/distill_experiment.py, 10% of its steps, the same command) twice per student and seed:
with the teacher's attn_pdrop, and with attn_pdrop = 0. The two teacher folders differ only in that number
(a teacher in eval mode never drops), so the students differ only in their attention's dropout.
The table in docs/distill.md was measured before the converted forms stopped dropping their output (the change
it led to); since then both rates give the attn_pdrop = 0 rows, which is what a rerun shows.

    python scripts/lm_dropout.py --seeds 0 1 2              # runs/distill/language/dropout/..., resumable
    python scripts/lm_dropout.py --seeds 1 2 --students katz_infsa:hedgehog   # what docs/distill.md's table ran
    python scripts/lm_dropout.py --report-only --publish docs   # docs/distill/dropout.json, docs/distill.md table
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
import distill_experiment as experiment  # noqa: E402

from linvit.reproduce.plan import Stage  # noqa: E402
from linvit.reproduce.report import replace_between  # noqa: E402
from linvit.reproduce.stages import run_stages  # noqa: E402
from linvit.reproduce.stats import mean_interval, paired_difference  # noqa: E402
from linvit_cli import run_command  # noqa: E402

STUDENTS = ("katz_infsa:hedgehog", "katz_infsa")
RATES = (0.1, 0.0)
BEGIN, END = "<!-- dropout:begin -->", "<!-- dropout:end -->"


def teacher_with_rate(teacher: Path, rate: float) -> Path:
    """A copy of the teacher folder whose config sets attn_pdrop (weights shared by a copy; eval mode ignores it)."""
    folder = teacher.parent / f"{teacher.name}_attn_pdrop{rate:g}"
    if not (folder / "config.json").is_file():
        shutil.copytree(teacher, folder, dirs_exist_ok=True)
        config = json.loads((folder / "config.json").read_text())
        config["attn_pdrop"] = rate
        (folder / "config.json").write_text(json.dumps(config, indent=2))
    return folder


def stages(out: Path, teacher: Path, seeds: list[int], students=STUDENTS) -> list[Stage]:
    windows = round(experiment.LM_BUDGET * experiment.LM_STEPS / 3) * experiment.LM_BATCH
    found = []
    for seed in seeds:
        for mixer in students:
            for rate in RATES:
                name = f"{mixer}/attn_pdrop{rate:g}/s{seed}"
                argv = ["distill", "--teacher", f"hf:{teacher_with_rate(teacher, rate)}", "--mixer", mixer]
                argv += ["--data", str(out.parent / "text.txt"), "--context", "128", "--seed", str(seed)]
                argv += ["--batch-size", str(experiment.LM_BATCH), "--train-windows", str(windows)]
                argv += ["--transfer-epochs", "1", "--epochs", "2", "--output", str(out / name)]
                argv += ["--workers", "0", "--device", "cpu", "--resume", "auto", "--no-progress"]
                info = {"mixer": mixer, "attn_pdrop": rate, "seed": seed}
                found.append(Stage(name, argv, [f"{name}/model.safetensors", f"{name}/metrics.jsonl"], 240, info))
    return found


def summary(out: Path) -> dict:
    rows = []
    for mixer in STUDENTS:
        gaps = {}
        for rate in RATES:
            runs = sorted((out / mixer / f"attn_pdrop{rate:g}").glob("s*/metrics.jsonl"))
            gaps[rate] = {int(p.parent.name[1:]): experiment.last_metrics(p)["loss_gap"] for p in runs}
        for rate in RATES:
            if gaps[rate]:
                rows.append({"mixer": mixer, "attn_pdrop": rate, "loss_gap": mean_interval(list(gaps[rate].values()))})
        if set(gaps[0.0]) & set(gaps[0.1]):
            rows[-1]["without_minus_with"] = paired_difference(gaps[0.0], gaps[0.1])
    return {"budget": experiment.LM_BUDGET, "teacher_steps": experiment.LM_STEPS, "rows": rows}


def table(record: dict) -> str:
    lines = ["| student | attention dropout | loss gap over the teacher (%) | seeds |", "|---|---|---|---|"]
    for row in record["rows"]:
        gap = row["loss_gap"]
        cell = f"{gap['mean']:.2f}"
        if gap["low"] is not None:
            cell += f" [{gap['low']:.2f}, {gap['high']:.2f}]"
        lines.append(f"| {row['mixer']} | {row['attn_pdrop']:g} | {cell} | {gap['n']} |")
    lines.append("")
    for row in record["rows"]:
        diff = row.get("without_minus_with")
        if diff and diff["low"] is not None:
            lines.append(
                f"{row['mixer']}: without minus with attention dropout, paired over seeds {diff['seeds']}: "
                f"{diff['mean']:+.2f} points [{diff['low']:+.2f}, {diff['high']:+.2f}]."
            )
    return "\n".join(lines).rstrip()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--students", nargs="+", choices=STUDENTS, default=list(STUDENTS))
    p.add_argument("--out", default="runs/distill")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--report-only", action="store_true")
    p.add_argument("--publish", default=None, metavar="DOCS")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    out = Path(args.out) / "language/dropout"
    if not args.report_only:
        teacher = experiment.language_teacher(Path(args.out), 0, experiment.lm_experiment())
        run_stages(out, stages(out, teacher, sorted(args.seeds), args.students), run_command)
    record = summary(out)
    (out / "summary.json").write_text(json.dumps(record, indent=2))
    print(table(record))
    if args.publish:
        docs = Path(args.publish)
        (docs / "distill/dropout.json").write_text(json.dumps(record, indent=2))
        replace_between(docs / "distill.md", BEGIN, END, f"{BEGIN}\n{table(record)}\n{END}")


if __name__ == "__main__":
    main()
