"""Issue 36's evidence: pretrained softmax models linearized by `linvit distill`, against the teacher, against
converting and fine-tuning, and against training the student from scratch for the same steps.

    python scripts/distill_experiment.py --part vision --seeds 0 1 2     # resumable, stage by stage
    python scripts/distill_experiment.py --part vision --task max
    python scripts/distill_experiment.py --part language --seeds 0 1 2
    python scripts/distill_experiment.py --part timing
    python scripts/distill_experiment.py --report-only --publish docs    # JSON, figure, docs/results.md table

Vision: the teachers are the reproduce protocol's softmax ViT-4L runs on `digit`, and on `max` with --task max
(OUT/vision_max; only the chosen recipes, not the evidence for them) (linvit.reproduce.plan: 14 epochs of 62
steps = 868 steps, the same command). Each student distils its teacher with `linvit distill` in
3 epochs of L canvases (L = budget x 868 / 3 steps of 64), for budgets of 5%, 10% and 25% of the teacher's
steps: Katz and pure InfSA in 2 epochs of attention transfer (lr 2e-3) and 1 end to end, Linear-InfSA in 1 and 2
(lr 1e-3; the runs of that recipe for every mixer and both first discounts are kept as the split's evidence).
Comparisons at each budget, the same steps and seeds: `linvit train --pretrained-file TEACHER --convert MIXER`
(convert, then fine-tune at the distillation's lr) and the student family trained from scratch with the protocol's
recipe.
Language: the teacher is docs/results.md's GPT-2 (scripts/lm_experiment.py: 4 layers, width 128, bytes of
standard-library docstrings, 1,200 steps of 32 windows; one teacher, seed 0, as training it takes 20 CPU
minutes); each seed distils it in 120 steps (10%): 40 of attention transfer, 80 end to end, 32 random
windows a step.
Timing: one GPT-2 shape (4 layers, width 128, 4 heads) with softmax attention and converted to causal
Katz-InfSA: decode tokens/s after a prompt of each length and the bytes the cache holds, to 8,192 tokens.
Each part writes OUT/<part>/summary.json; every run folder is reused when it finished.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import importlib.util
import json
import time
from pathlib import Path

import torch
from distill_report import ROWS_BEGIN, ROWS_END, ROWS_METHODS, VISION_PARTS, figure, rows_table, tables  # scripts/

from linvit.distillation.task import default_gamma
from linvit.reproduce.plan import RECIPES, TASKS, Planner, Stage, model_kwargs
from linvit.reproduce.report import replace_between
from linvit.reproduce.stages import run_stages
from linvit.reproduce.stats import mean_interval, paired_difference
from linvit_cli import run_command

MIXERS = {"katz_infsa": "katz", "pure_infsa": "pure", "linear_infsa": "linear"}  # --mixer -> protocol family
BUDGETS = (0.05, 0.10, 0.25)
TEACHER_STEPS = 14 * 62  # the protocol's 14 epochs of 4,000 canvases in batches of 64
LM_STEPS, LM_BATCH, LM_BUDGET = 1200, 32, 0.10
BEGIN, END = "<!-- distill:begin -->", "<!-- distill:end -->"
# runs with distill's default discount (default_gamma: 0.5 for Katz, 0.9 else) split 1 + 2 epochs at transfer lr 1e-3
# (the stages' first recipe) are in OUT/vision/distill (--gamma-init 0.5 for every mixer) and distill_gamma0.9;
# the recipe the "distill" rows use for Katz and pure InfSA gives the budget's first 2/3 to attention transfer at
# lr 2e-3 (OUT/vision/distill_transfer), which kept more at 10% in probes (seed 0, Katz: 93.5 against 91.0);
# Linear-InfSA keeps the first recipe: attention transfer alone keeps half of its teacher (49.7% at 58 steps)
GAMMA_FOLDERS = {0.5: "distill", 0.9: "distill_gamma0.9"}
TRANSFER_HEAVY = "distill_transfer"
# the learned-map Katz student on Katz's recipe with one change each (folder -> method, added flags): from first
# discount 0.1 (issue 44's why-not evidence, scripts/katz_gap.py: Katz's hops >= 2 carry a third of its weight at
# 0.5, where a softmax teacher has one hop), and with Hedgehog's attention-weight loss beside the output MSE
VARIANTS = {
    "distill_transfer_gamma0.1": ("distill, gamma_init 0.1", ["--gamma-init", "0.1"]),
    "distill_transfer_xent": ("distill, mse+xent", ["--transfer-loss", "mse+xent"]),
    # the learned map twice the head dim (64 -> 128; 2f features a head): with the weight loss at 64 tokens it raised
    # the anchor on each seed (docs/results.md, the recipe sweep); here on every task's output MSE, to decide whether
    # it becomes the default
    "distill_f128": ("distill, f = 128", ["--feature-dim", "128"]),
    # LoLCATs trains its maps at lr 1e-2: here the maps alone at 1e-2 in attention transfer, the rest of each layer at
    # the recipe's 2e-3 (the whole layer at 1e-2 collapsed in the recipe sweep: -23 points)
    "distill_map_lr": ("distill, maps at lr 1e-2", ["--map-lr", "1e-2"]),
}
# a variant's rows appear where its runs exist (the anchor's mse+xent: katz_rows' comparison on the same loss)
VARIANT_MIXERS = ("katz_infsa:hedgehog", "katz_rows:hedgehog", "linear_attention:hedgehog")
# issue 44: students with Hedgehog's learned feature maps, Katz-InfSA's and the anchor form's, ViT-AdaLA's plain
# linear attention ("adala"), on Katz's recipe (distill rows only); katz_rows: Katz-InfSA with per-query normalised
# rows (layers.katz_rows)
LEARNED = ("katz_infsa:hedgehog", "katz_rows:hedgehog", "linear_attention:hedgehog")
TRANSFER_MIXERS = ("katz_infsa", "pure_infsa", *LEARNED)
STUDENTS = (*MIXERS, *LEARNED)  # every student of the vision tables, in their order
# the language students: causal Katz (ELU + 1, and learned maps), pure InfSA, and the anchor, LoLCATs' form
# (causal linear attention with learned maps), without and with its 64-token sliding window of exact softmax; a
# student's name -> its mixer and the flags it adds to the recipe ("+transfer": the whole budget on attention
# transfer, no end-to-end stage). Each names its window and stages: left open, linvit distill picks them for a
# causal teacher (distillation.recipe: window 64, attention transfer only), which would change these rows.
NO_WINDOW, WINDOW = ["--window", "0", "--stages", "both"], ["--window", "64", "--stages", "both"]
LANGUAGE_STUDENTS = {
    "katz_infsa": ("katz_infsa", NO_WINDOW),
    "pure_infsa": ("pure_infsa", NO_WINDOW),
    "katz_infsa:hedgehog": ("katz_infsa:hedgehog", NO_WINDOW),
    "linear_attention:hedgehog": ("linear_attention:hedgehog", NO_WINDOW),
    "katz_infsa:hedgehog+w64": ("katz_infsa:hedgehog", WINDOW),
    "linear_attention:hedgehog+w64": ("linear_attention:hedgehog", WINDOW),
    "katz_infsa:hedgehog+w64+transfer": ("katz_infsa:hedgehog", ["--window", "64", "--stages", "attention"]),
}
# the long-context part (issue 44.4): a teacher trained at 512 tokens, where the window is an eighth of the context
# (the last: linvit distill's default for a causal teacher, --window 64 --stages attention)
LONG_STUDENTS = (
    "katz_infsa:hedgehog+w64",
    "linear_attention:hedgehog+w64",
    "katz_infsa:hedgehog",
    "katz_infsa:hedgehog+w64+transfer",
)
START = "start.json"  # in a longer-context teacher's folder: the teacher it started from (language_teacher)
LANGUAGE_PARTS = {128: "language", 512: "language512"}  # context -> the part's folder under OUT and docs/distill


def methods(mixer: str) -> dict[str, str]:
    """method -> its runs' folder under the vision part (OUT/vision, OUT/vision_max), for one student mixer."""
    if mixer in LEARNED:
        variants = {method: folder for folder, (method, _) in VARIANTS.items()} if mixer in VARIANT_MIXERS else {}
        return {"distill": TRANSFER_HEAVY, **variants}
    chosen = default_gamma(mixer)
    other = next(g for g in GAMMA_FOLDERS if g != chosen)
    if mixer in TRANSFER_MIXERS:
        found = {"distill": TRANSFER_HEAVY, "distill, 1 + 2 epochs": GAMMA_FOLDERS[chosen]}
        found[f"distill, 1 + 2 epochs, gamma_init {other}"] = GAMMA_FOLDERS[other]
    else:
        found = {"distill": GAMMA_FOLDERS[chosen], f"distill, gamma_init {other}": GAMMA_FOLDERS[other]}
    return {**found, "convert + fine-tune": "finetune", "from scratch": "scratch"}


RECIPE = RECIPES["full"]
# the protocol's task -> its part's folder under OUT; digit64: `digit` at patch 4, 64 tokens (issue 44.4: where
# linear time matters), its own teachers on the protocol's recipe
PARTS = {"digit": "vision", "max": "vision_max", "digit64": "vision64"}
VISION_TASKS = {**TASKS, "digit64": dataclasses.replace(TASKS["digit"], patch=4)}


def lm_experiment():
    """scripts/lm_experiment.py as a module: the GPT-2 teacher, its text and its training."""
    spec = importlib.util.spec_from_file_location("lm_experiment", Path(__file__).with_name("lm_experiment.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def canvases(budget: float) -> int:
    """Canvases an epoch so that 3 epochs (both stages together) of batches of 64 are budget x 868 steps."""
    return round(budget * TEACHER_STEPS / 3) * 64


def students_data(task, budget: float) -> str:
    """The --data of a task's students at a budget: its canvases, the first `canvases(budget)` of an epoch."""
    return f"digits:{task.name},canvas={task.canvas},clutter={task.clutter},length={canvases(budget)}"


def finished_top1s(part: Path, folder: str, seeds) -> dict[int, float]:
    """Final val top-1 of PART/FOLDER/s<seed> for every seed whose run finished."""
    runs = {s: part / folder / f"s{s}" for s in seeds}
    return {
        s: last_metrics(r / "metrics.jsonl")["val_top1"] for s, r in runs.items() if (r / "model.safetensors").is_file()
    }


def vision_stages(out: str, seeds: list[int], task_name: str = "digit", budgets=(0.10, 0.05, 0.25)) -> list[Stage]:
    """The teachers, then every run at the goal's 10% budget, then at 5%, then 25% (distillation before the
    comparisons), so a sweep cut short has the goal's rows first. On `digit`, also the recipes kept as evidence
    for the chosen ones (both first discounts, the 1 + 2 split for every mixer)."""
    task, part = VISION_TASKS[task_name], f"{out}/{PARTS[task_name]}"
    stages = [Planner(part, "cpu", RECIPE).train(task, "softmax", seed) for seed in seeds]
    for budget in budgets:
        data = students_data(task, budget)
        teachers = {seed: f"{part}/runs/{task.name}/softmax/s{seed}" for seed in seeds}
        for seed, teacher_run in teachers.items():
            chosen = [_distill_transfer_heavy(part, teacher_run, data, m, seed, budget) for m in TRANSFER_MIXERS]
            for mixer in VARIANT_MIXERS:
                chosen += [_distill_transfer_heavy(part, teacher_run, data, mixer, seed, budget, v) for v in VARIANTS]
            chosen.append(
                _distill(part, teacher_run, data, "linear_infsa", seed, budget, default_gamma("linear_infsa"))
            )
            evidence = [_distill(part, teacher_run, data, m, seed, budget, g) for m in MIXERS for g in GAMMA_FOLDERS]
            stages += chosen + [s for s in evidence if task_name == "digit" and s.name not in {c.name for c in chosen}]
        for seed, teacher_run in teachers.items():
            for mixer, family in MIXERS.items():
                stages += [
                    _convert_finetune(part, teacher_run, data, mixer, seed, budget, task),
                    _scratch(part, data, family, seed, budget, task),
                ]
    return stages


def stage(name: str, part: str, argv: list[str], info: dict) -> Stage:
    """A run of `linvit` argv in part/name, resumable, 1 worker on CPU."""
    folder = f"{part}/{name}"
    argv = [*argv, "--output", folder, "--workers", "0", "--device", "cpu", "--resume", "auto", "--no-progress"]
    return Stage(name, argv, [f"{name}/model.safetensors", f"{name}/metrics.jsonl"], 30, info)


def _distill(part, teacher_run, data, mixer, seed, budget, gamma: float) -> Stage:
    """The 1 + 2 recipe at first discount gamma, in its GAMMA_FOLDERS folder."""
    argv = ["distill", "--teacher", teacher_run, "--data", data, "--mixer", mixer, "--seed", str(seed)]
    argv += ["--gamma-init", str(gamma), "--transfer-epochs", "1", "--epochs", "2", "--batch-size", "64"]
    info = {"method": "distill", "mixer": mixer, "seed": seed, "budget": budget}
    return stage(f"{GAMMA_FOLDERS[gamma]}/{mixer}/b{budget:g}/s{seed}", part, argv, info)


def transfer_heavy_argv(teacher_run: str, data: str, mixer: str, seed: int, extra: list[str] = ()) -> list[str]:
    """`linvit distill` on Katz's recipe (2 epochs of attention transfer at lr 2e-3, 1 end to end) with extra
    flags; the output MSE unless extra names a --transfer-loss (named, not left to distill's default, so that the
    tables' `distill` rows measure the same thing whatever that default becomes)."""
    argv = ["distill", "--teacher", teacher_run, "--data", data, "--mixer", mixer, "--seed", str(seed)]
    argv += ["--transfer-epochs", "2", "--transfer-lr", "2e-3", "--epochs", "1", "--batch-size", "64", *extra]
    return argv if "--transfer-loss" in extra else [*argv, "--transfer-loss", "mse"]


def _distill_transfer_heavy(part, teacher_run, data, mixer, seed, budget, variant: str | None = None) -> Stage:
    """Katz's recipe (2 epochs of attention transfer, 1 end to end); a VARIANTS one in its own folder."""
    argv = transfer_heavy_argv(teacher_run, data, mixer, seed, [] if variant is None else VARIANTS[variant][1])
    info = {"method": "distill", "mixer": mixer, "seed": seed, "budget": budget}
    folder = variant or TRANSFER_HEAVY
    return stage(f"{folder}/{mixer}/b{budget:g}/s{seed}", part, argv, info)


def _train_argv(model: str, family: str, data: str, seed: int, lr: float, task) -> list[str]:
    argv = ["train", "--model", model, "--data", data, "--img-size", str(task.canvas), "--crop-pct", "1.0"]
    argv += ["--seed", str(seed), "--epochs", "3", "--batch-size", "64", "--lr", str(lr), "--drop-path", "0"]
    argv += ["--aa", "none", "--mixup", "0", "--cutmix", "0", "--reprob", "0", "--smoothing", "0", "--scale", "1", "1"]
    argv += ["--ratio", "1", "1", "--hflip", "0", "--warmup-epochs", "0"]
    return argv + model_kwargs(family, RECIPE, task)


def _convert_finetune(part, teacher_run, data, mixer, seed, budget, task) -> Stage:
    argv = _train_argv("vit_4l_patch16_224", "softmax", data, seed, 1e-4, task)  # the distillation's end-to-end lr
    argv += ["--pretrained-file", f"{teacher_run}/model.safetensors", "--convert", mixer]
    info = {"method": "convert + fine-tune", "mixer": mixer, "seed": seed, "budget": budget}
    return stage(f"finetune/{mixer}/b{budget:g}/s{seed}", part, argv, info)


def _scratch(part, data, family, seed, budget, task) -> Stage:
    from linvit.reproduce.plan import FAMILIES

    mixer = next(m for m, f in MIXERS.items() if f == family)
    argv = _train_argv(FAMILIES[family][0], family, data, seed, RECIPE.lr, task)  # the protocol's recipe
    info = {"method": "from scratch", "mixer": mixer, "seed": seed, "budget": budget}
    return stage(f"scratch/{mixer}/b{budget:g}/s{seed}", part, argv, info)


def last_metrics(path: Path) -> dict:
    return json.loads(path.read_text().splitlines()[-1])


def steps_of(run: Path) -> int:
    """Optimizer steps a run took, stages included, from its args.yaml (epochs x canvases / batch)."""
    import yaml

    total = 0
    for folder in (run / "attention", run):
        if (folder / "args.yaml").is_file():
            args = yaml.safe_load((folder / "args.yaml").read_text())
            length = int(args["data"].split("length=")[1]) if "length=" in args["data"] else 4000
            total += args["epochs"] * (length // args["batch_size"])
    return total


def vision_summary(out: Path, seeds: list[int], task_name: str = "digit", published: Path | None = None) -> dict:
    """Per (method, mixer, budget): val top-1 and its share of the teacher's (retention) over seeds. A row without
    runs under OUT keeps the published summary's row where that summary's teachers are these (the protocol's runs
    are deterministic on one CPU kind and thread count: there the same seeds retrain the same teachers), so one new
    student needs only its runs."""
    summary = _vision_runs_summary(out, seeds, task_name)
    earlier = json.loads(published.read_text()) if published is not None and published.is_file() else None
    if earlier is None or summary["teachers"] != {int(s): v for s, v in earlier["teachers"].items()}:
        if earlier is not None:
            print(f"{published}: other teachers than OUT's ({earlier['teachers']}); its rows are not kept")
        return summary
    found = {(r["method"], r["mixer"], r["budget"]) for r in summary["rows"]}
    kept = [r | {"source": "published"} for r in earlier["rows"] if (r["method"], r["mixer"], r["budget"]) not in found]
    return summary | {"rows": _sorted_rows(summary["rows"] + kept)}


def _sorted_rows(rows: list[dict]) -> list[dict]:
    """vision rows in the order _vision_runs_summary writes them: student, method, budget."""
    order = [(mixer, method) for mixer in STUDENTS for method in methods(mixer)]
    rank = {key: i for i, key in enumerate(order)}
    return sorted(rows, key=lambda r: (rank.get((r["mixer"], r["method"]), len(order)), r["budget"]))


def _vision_runs_summary(out: Path, seeds: list[int], task_name: str) -> dict:
    part = out / PARTS[task_name]
    teachers = {}
    for seed in seeds:
        metrics = part / f"runs/{VISION_TASKS[task_name].name}/softmax/s{seed}/metrics.jsonl"
        if metrics.is_file():
            teachers[seed] = last_metrics(metrics)["val_top1"]
    rows = []
    for mixer in STUDENTS:
        for method, folder in methods(mixer).items():
            for budget in BUDGETS:
                runs = {}
                for seed in teachers:
                    run = part / f"{folder}/{mixer}/b{budget:g}/s{seed}"
                    if (run / "model.safetensors").is_file():
                        runs[seed] = (last_metrics(run / "metrics.jsonl")["val_top1"], steps_of(run))
                if not runs:
                    continue
                val = {s: v for s, (v, _) in runs.items()}
                retention = {s: 100 * v / teachers[s] for s, v in val.items()}
                steps = sorted({n for _, n in runs.values()})
                rows.append(
                    {
                        "method": method,
                        "mixer": mixer,
                        "budget": budget,
                        "steps": steps,
                        "seeds": list(val),  # the order of the values below
                        "val_top1": mean_interval(list(val.values())),
                        "retention": mean_interval(list(retention.values())),
                        "vs_teacher": paired_difference(val, teachers),
                    }
                )
    teacher = mean_interval(list(teachers.values()))
    tokens = (VISION_TASKS[task_name].canvas // VISION_TASKS[task_name].patch) ** 2
    return {
        "task": VISION_TASKS[task_name].name,
        "tokens": tokens,
        "teacher_val_top1": teacher,
        "teachers": teachers,
        "rows": rows,
    }


def language_teacher(out: Path, seed: int, lm, context: int = 128) -> Path:
    """The GPT-2 teacher of docs/results.md for this seed (trained once, saved as a Hugging Face folder). At a
    longer context it sees the same tokens a step (32 x 128 / context windows) and starts from the 128-token
    teacher (long_context_start): trained from scratch at 512 tokens it stopped at 2.649 nats, far above the
    128-token teacher's 2.082, and its students beat it."""
    part = out / LANGUAGE_PARTS[context]
    folder = part / f"teacher_s{seed}"
    text_file = part / "text.txt"
    if not text_file.is_file():
        text = lm.stdlib_docstrings(400 * 1024)
        text_file.parent.mkdir(parents=True, exist_ok=True)
        text_file.write_text(text.decode("utf-8", errors="ignore"), encoding="utf-8")
    if not (folder / "config.json").is_file():
        short = None if context == 128 else language_teacher(out, seed, lm, 128)
        lm.CONTEXT, lm.BATCH = context, lm_batch(context)  # lm_experiment's module-wide shape
        torch.manual_seed(seed)
        data = torch.tensor(list(text_file.read_text(encoding="utf-8").encode("utf-8")), dtype=torch.long)
        cut = int(len(data) * 0.9)
        model = lm.tiny_gpt2() if short is None else long_context_start(short, context)
        curve = lm.train(model, data[:cut], data[cut:], LM_STEPS, seed, f"teacher s{seed}", LM_STEPS // 4)
        model.save_pretrained(folder)
        (folder / "curve.json").write_text(json.dumps(curve))
        if short is not None:  # what language_summary reports: the teacher's own record, not today's code
            (folder / START).write_text(json.dumps({"context": 128, "steps": LM_STEPS, "from": str(short)}))
    return folder


def long_context_start(short: Path, context: int):
    """The short-context teacher with its learned position table copied end to end up to `context` rows (how
    Longformer extended RoBERTa's 512 positions): every other weight as trained, the first rows its own."""
    import transformers

    base = transformers.GPT2LMHeadModel.from_pretrained(short)
    config = copy.deepcopy(base.config)
    config.n_positions = context
    model = transformers.GPT2LMHeadModel(config)
    state = base.state_dict()
    table = state["transformer.wpe.weight"]
    state["transformer.wpe.weight"] = table.repeat(-(-context // len(table)), 1)[:context]
    model.load_state_dict(state)
    return model


def lm_batch(context: int) -> int:
    """Windows a step: the 128-token part's 32, and the same tokens a step at a longer context."""
    return LM_BATCH * 128 // context


def is_transfer_only(flags: list[str]) -> bool:
    """A language student that spends its whole budget on attention transfer (one stage, in the run itself)."""
    return flags[flags.index("--stages") + 1] == "attention"


def language_stages(out: str, seed: int, teacher: Path, context: int = 128) -> list[Stage]:
    part, batch = f"{out}/{LANGUAGE_PARTS[context]}", lm_batch(context)
    windows = round(LM_BUDGET * LM_STEPS / 3) * batch
    students = LANGUAGE_STUDENTS if context == 128 else {s: LANGUAGE_STUDENTS[s] for s in LONG_STUDENTS}
    stages = []
    for student, (mixer, flags) in students.items():
        name = f"distill/{student}/s{seed}"
        transfer_only = is_transfer_only(flags)
        epochs = ["--transfer-epochs", "3"] if transfer_only else ["--transfer-epochs", "1", "--epochs", "2"]
        argv = ["distill", "--teacher", f"hf:{teacher}", "--data", f"{part}/text.txt", "--mixer", mixer, *flags]
        argv += ["--context", str(context), "--batch-size", str(batch), "--train-windows", str(windows), *epochs]
        argv += ["--seed", str(seed), "--output", f"{part}/{name}"]
        argv += ["--workers", "0", "--device", "cpu", "--resume", "auto", "--no-progress"]
        info = {"mixer": student, "seed": seed}
        outputs = [f"{name}/model.safetensors", f"{name}/metrics.jsonl"]
        stages.append(Stage(name, argv, outputs, 120, info, inputs=[f"{teacher.name}/model.safetensors"]))
    return stages


def language_summary(out: Path, seeds: list[int], context: int = 128, published: Path | None = None) -> dict:
    """Per student: the final val loss and gap, and the gap after attention transfer (the first stage's last
    evaluation), over seeds. A student without runs under OUT keeps its row of the published summary."""
    part = out / LANGUAGE_PARTS[context]
    earlier = json.loads(published.read_text())["rows"] if published is not None and published.is_file() else []
    earlier = {r["mixer"]: r for r in earlier}
    rows = []
    for student, (_, flags) in LANGUAGE_STUDENTS.items():
        runs, transfer = {}, {}
        for seed in seeds:
            run = part / f"distill/{student}/s{seed}"
            if (run / "model.safetensors").is_file():  # --stages attention writes its one stage to the run itself
                runs[seed] = last_metrics(run / "metrics.jsonl")
                first = run if is_transfer_only(flags) else run / "attention"
                transfer[seed] = last_metrics(first / "metrics.jsonl")["loss_gap"]
        if runs:
            rows.append(
                {
                    "mixer": student,
                    "seeds": list(runs),
                    "val_loss": mean_interval([r["val_loss"] for r in runs.values()]),
                    "teacher_val_loss": mean_interval([r["teacher_val_loss"] for r in runs.values()]),
                    "loss_gap": mean_interval([r["loss_gap"] for r in runs.values()]),
                    "transfer_loss_gap": mean_interval(list(transfer.values())) if transfer else None,
                    "steps": round(LM_BUDGET * LM_STEPS / 3) * 3,
                }
            )
        elif student in earlier:
            rows.append(earlier[student])
    summary = {"teacher_steps": LM_STEPS, "context": context, "batch": lm_batch(context), "rows": rows}
    start = part / "teacher_s0" / START  # language_teacher: started from the 128-token teacher's weights
    if start.is_file():
        summary["teacher_start"] = {k: v for k, v in json.loads(start.read_text()).items() if k != "from"}
    elif context != 128 and published is not None and published.is_file():
        summary.update({k: v for k, v in json.loads(published.read_text()).items() if k == "teacher_start"})
    return summary


def decode_timing(lengths=(512, 1024, 2048, 4096, 8192), new_tokens: int = 32) -> dict:
    """Decode tokens/s after a prompt of each length, and the bytes the cache holds then, softmax vs Katz."""
    import transformers

    import linvit

    config = transformers.GPT2Config(
        vocab_size=256, n_positions=max(lengths) + new_tokens, n_embd=128, n_layer=4, n_head=4, bos_token_id=0
    )
    config.eos_token_id = 0
    torch.manual_seed(0)
    softmax = transformers.GPT2LMHeadModel(config).eval()
    katz = linvit.convert(transformers.GPT2LMHeadModel(config).eval(), "katz_infsa")
    rows = []
    for length in lengths:
        prompt = torch.randint(0, 256, (1, length), generator=torch.Generator().manual_seed(length))
        for name, model in (("softmax", softmax), ("katz_infsa", katz)):
            rows.append({"model": name, "context": length, **_decode(model, prompt, new_tokens)})
            print(rows[-1], flush=True)
    return {"model": "GPT-2 shape: 4 layers, width 128, 4 heads (random weights)", "threads": 1, "rows": rows}


@torch.no_grad()
def _decode(model, prompt: torch.Tensor, new_tokens: int) -> dict:
    import transformers

    cache = transformers.DynamicCache(config=model.config)
    out = model(prompt, cache=cache, use_cache=True)
    token = out.logits[:, -1:].argmax(-1)
    start = time.perf_counter()
    for _ in range(new_tokens):
        out = model(token, cache=cache, use_cache=True)
        token = out.logits[:, -1:].argmax(-1)
    seconds = time.perf_counter() - start
    return {"tokens_per_second": new_tokens / seconds, "cache_bytes": _cache_bytes(cache)}


def _cache_bytes(cache) -> int:
    total = 0
    for layer in cache.layers:
        tensors = [getattr(layer, "keys", None), getattr(layer, "values", None), *(getattr(layer, "state", None) or ())]
        total += sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor))
    return total


def publish(out: Path, docs: Path) -> None:
    """docs/distill/: the summaries and a figure; docs/results.md's section between the markers. A part without
    runs under OUT keeps its published summary (docs/distill/PART.json), so a clone regenerates the same page."""
    target = docs / "distill"
    target.mkdir(parents=True, exist_ok=True)
    summaries = {}
    for part in (*PARTS.values(), *LANGUAGE_PARTS.values(), "timing"):
        for source in (out / part / "summary.json", target / f"{part}.json"):
            summary = json.loads(source.read_text()) if source.is_file() else None
            if summary is None or not summary.get("rows", True):  # a part without a finished row yet waits
                continue
            if not other_teachers(summary, target / f"{part}.json"):
                summaries[part] = summary
                break
    if not summaries:
        raise SystemExit(f"nothing to publish: no summary under {out} or {target}")
    for part, summary in summaries.items():
        (target / f"{part}.json").write_text(json.dumps(summary, indent=2))
    for part, figure_name in VISION_PARTS.items():
        if part in summaries:
            figure(summaries[part], target / figure_name)
    text = tables(summaries)
    replace_between(docs / "results.md", BEGIN, END, f"{BEGIN}\n{text}\n{END}")
    comparison = rows_comparison(out, target / "katz_rows.json")
    (target / "katz_rows.json").write_text(json.dumps(comparison, indent=2))
    replace_between(docs / "results.md", ROWS_BEGIN, ROWS_END, f"{ROWS_BEGIN}\n{rows_table(comparison)}\n{ROWS_END}")


def other_teachers(summary: dict, published: Path) -> bool:
    """A vision summary whose teachers are not the published part's: it would replace rows it has no runs for
    (the part's other methods and budgets) with nothing, so the published part stays (rows_comparison reads it)."""
    if "teachers" not in summary or not published.is_file():
        return False
    same = {int(s): v for s, v in json.loads(published.read_text())["teachers"].items()}
    if {int(s): v for s, v in summary["teachers"].items()} == same:
        return False
    print(f"{published} kept: OUT's teachers ({summary['teachers']}) are not its ({same})")
    return True


# issue 44: katz_rows beside Katz-InfSA with the same maps and the anchor, each task on one set of teachers
ROWS_FORMS = ("katz_infsa:hedgehog", "katz_rows:hedgehog", "linear_attention:hedgehog")


def rows_comparison(out: Path, published: Path) -> dict:
    """Per vision task, the three forms' distill rows at 10% on the same teachers (and their `distill` rows at
    another budget where all three have one): OUT's runs (with the published
    part's rows where its teachers are OUT's), else the published comparison's task. `retrained`: the teachers are
    not the ones the task's main table was measured on (retrained on another CPU kind: docs/reproduce.md)."""
    earlier = json.loads(published.read_text()) if published.is_file() else {}
    found = {}
    for task_name, part in PARTS.items():
        if not (out / part).is_dir():
            if task_name in earlier:
                found[task_name] = earlier[task_name]
            continue
        summary = vision_summary(out, [0, 1, 2], task_name, published.parent / f"{part}.json")
        rows = [r for r in summary["rows"] if r["method"] in ROWS_METHODS and r["mixer"] in ROWS_FORMS]
        rows = [r for r in rows if r["budget"] == 0.1 or r["method"] == "distill"]  # other budgets: the recipe
        rows = [r for r in rows if {q["mixer"] for q in rows if q["budget"] == r["budget"]} == set(ROWS_FORMS)]
        if {r["mixer"] for r in rows if r["method"] == "distill" and r["budget"] == 0.1} != set(ROWS_FORMS):
            if task_name in earlier:
                found[task_name] = earlier[task_name]
            continue
        retrained = other_teachers(summary, published.parent / f"{part}.json")
        keep = ("task", "tokens", "teacher_val_top1", "teachers")
        found[task_name] = {**{k: summary[k] for k in keep}, "retrained": retrained, "rows": rows}
    return found


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--part", choices=["vision", "language", "timing"], default=None)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--task", choices=list(PARTS), default="digit", help="the vision part's protocol task")
    p.add_argument("--context", type=int, choices=list(LANGUAGE_PARTS), default=128, help="the language part's")
    p.add_argument("--budgets", type=float, nargs="+", choices=BUDGETS, default=[0.10, 0.05, 0.25], help="in order")
    p.add_argument("--out", default="runs/distill")
    p.add_argument("--threads", type=int, default=1)
    stage_kinds = ["train", TRANSFER_HEAVY, *VARIANTS, *GAMMA_FOLDERS.values(), "finetune", "scratch"]
    p.add_argument("--methods", nargs="+", choices=stage_kinds, default=stage_kinds, help="vision stages' folders")
    students = sorted(set(STUDENTS) | set(LANGUAGE_STUDENTS))
    p.add_argument("--students", nargs="+", choices=students, default=students, help="the students' mixers")
    p.add_argument("--report-only", action="store_true")
    p.add_argument("--publish", default=None, metavar="DOCS")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    seeds = sorted(args.seeds)
    if args.part == "vision" and not args.report_only:
        stages = vision_stages(args.out, seeds, args.task, args.budgets)
        stages = [s for s in stages if s.name.split("/")[0] in args.methods]
        stages = [s for s in stages if s.info.get("mixer") in (None, *args.students)]  # teachers have no mixer
        run_stages(out / PARTS[args.task], stages, run_command)
    if args.part == "language" and not args.report_only:
        teacher = language_teacher(out, 0, lm_experiment(), args.context)  # one teacher (20 CPU minutes)
        stages = [s for seed in seeds for s in language_stages(args.out, seed, teacher, args.context)]
        stages = [s for s in stages if s.info["mixer"] in args.students]
        run_stages(out / LANGUAGE_PARTS[args.context], stages, run_command)
    if args.part == "timing" and not args.report_only:
        (out / "timing").mkdir(parents=True, exist_ok=True)
        (out / "timing/summary.json").write_text(json.dumps(decode_timing(), indent=2))
    for task_name, part in PARTS.items():
        if (out / part).is_dir():
            published = Path(args.publish or "docs") / f"distill/{part}.json"
            summary = vision_summary(out, [0, 1, 2], task_name, published)
            (out / part / "summary.json").write_text(json.dumps(summary, indent=2))
    for context, part in LANGUAGE_PARTS.items():
        if (out / part).is_dir():
            published = Path(args.publish or "docs") / f"distill/{part}.json"
            summary = language_summary(out, [0, 1, 2], context, published)
            (out / part / "summary.json").write_text(json.dumps(summary, indent=2))
    if args.publish:
        publish(out, Path(args.publish))


if __name__ == "__main__":
    main()
