"""Issue 25's language-model experiment: a tiny GPT-2 trained with softmax attention on text that ships with
Python, converted to pure InfSA, then fine-tuned; loss curves for the three states.

    python scripts/lm_experiment.py                      # writes runs/lm-experiment/{results.json, curves.png}
    python scripts/lm_experiment.py --publish docs       # ... and docs/lm/ and docs/results.md's table

Text: the docstrings of the standard library's own modules (ast.get_docstring over sysconfig's stdlib
folder, files in sorted order), as bytes (a 256-symbol vocabulary: no tokenizer to download); the last 10%
is the validation text. Stages, each from the previous one's weights and with the same optimiser recipe:
  1. softmax: GPT-2 (4 layers, width 128, 4 heads, context 128) trained from scratch for --pretrain steps;
  2. converted: linvit.convert(model, "pure_infsa") of those weights, evaluated before any training;
  3. converted + fine-tuned, and, for a fair comparison, the softmax model trained for the same extra steps.
"""

from __future__ import annotations

import argparse
import ast
import copy
import json
import math
import shutil
import sysconfig
import time
from pathlib import Path

import torch
from tqdm import tqdm

import linvit
from linvit.reproduce.report import replace_between

CONTEXT, BATCH, LR = 128, 32, 1e-3
BEGIN, END = "<!-- lm:begin -->", "<!-- lm:end -->"


def stdlib_docstrings(limit_bytes: int) -> bytes:
    """Module, class and function docstrings of the standard library, up to limit_bytes (deterministic)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    chunks, size = [], 0
    for path in sorted(root.glob("*.py")):
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        for node in [tree, *ast.walk(tree)]:
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node)
                if doc:
                    chunks.append(doc.encode("utf-8") + b"\n\n")
                    size += len(chunks[-1])
        if size >= limit_bytes:
            break
    return b"".join(chunks)[:limit_bytes]


def batches(data: torch.Tensor, steps: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        starts = torch.randint(0, len(data) - CONTEXT - 1, (BATCH,), generator=gen)
        yield torch.stack([data[s : s + CONTEXT] for s in starts.tolist()])


@torch.no_grad()
def val_loss(model, val: torch.Tensor) -> float:
    """Mean next-byte cross-entropy (nats) over every full window of the validation text."""
    model.eval()
    windows = val[: len(val) // CONTEXT * CONTEXT].view(-1, CONTEXT)
    losses = [float(model(w, labels=w, use_cache=False).loss) for w in windows.split(64)]
    model.train()
    return sum(losses) / len(losses)


def train(model, train_data, val_data, steps: int, seed: int, label: str, every: int) -> list[dict]:
    """AdamW with a warm-up and cosine decay; the curve: (step, train loss, val loss) every `every` steps."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.01)
    warm = max(1, steps // 20)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min(1.0, (s + 1) / warm) * 0.5 * (1 + math.cos(math.pi * min(s, steps) / steps))
    )
    curve, recent = [{"step": 0, "train": None, "val": val_loss(model, val_data)}], []
    model.train()
    for step, batch in enumerate(tqdm(batches(train_data, steps, seed), total=steps, desc=label), start=1):
        loss = model(batch, labels=batch, use_cache=False).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        recent.append(float(loss))
        if step % every == 0 or step == steps:
            curve.append({"step": step, "train": sum(recent) / len(recent), "val": val_loss(model, val_data)})
            recent = []
    return curve


def tiny_gpt2():
    import transformers

    cfg = transformers.GPT2Config(vocab_size=256, n_positions=CONTEXT, n_embd=128, n_layer=4, n_head=4)
    return transformers.GPT2LMHeadModel(cfg)


def run(args) -> dict:
    torch.manual_seed(args.seed)
    text = stdlib_docstrings(args.text_kb * 1024)
    data = torch.tensor(list(text), dtype=torch.long)
    split = int(len(data) * 0.9)
    train_data, val_data = data[:split], data[split:]
    start = time.perf_counter()
    softmax = tiny_gpt2()
    pretrain = train(softmax, train_data, val_data, args.pretrain, args.seed, "softmax", args.every)
    converted = linvit.convert(copy.deepcopy(softmax), "pure_infsa", gamma_init=args.gamma_init)
    converted_before = val_loss(converted, val_data)
    fine_tuned = train(converted, train_data, val_data, args.finetune, args.seed + 1, "pure InfSA", args.every)
    softmax_more = train(softmax, train_data, val_data, args.finetune, args.seed + 1, "softmax", args.every)
    return {
        "text": {
            "source": "standard-library docstrings (ast.get_docstring)",
            "bytes": len(text),
            "val_bytes": len(val_data),
        },
        "model": "GPT-2, 4 layers, width 128, 4 heads, context 128, byte vocabulary",
        "recipe": {"batch": BATCH, "lr": LR, "pretrain_steps": args.pretrain, "finetune_steps": args.finetune},
        "seed": args.seed,
        "gamma_init": args.gamma_init,
        "curves": {"softmax_pretrain": pretrain, "pure_infsa_finetune": fine_tuned, "softmax_continued": softmax_more},
        "val_loss": {
            "softmax": pretrain[-1]["val"],
            "converted_without_training": converted_before,
            "converted_fine_tuned": fine_tuned[-1]["val"],
            "softmax_same_extra_steps": softmax_more[-1]["val"],
        },
        "minutes": (time.perf_counter() - start) / 60,
        "threads": torch.get_num_threads(),
    }


def curves_figure(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pre = result["curves"]["softmax_pretrain"]
    offset = pre[-1]["step"]
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    ax.plot([p["step"] for p in pre], [p["val"] for p in pre], color="tab:blue", label="softmax (from scratch)")
    for key, color, label in (
        ("softmax_continued", "tab:blue", "softmax, same extra steps"),
        ("pure_infsa_finetune", "tab:red", "converted to pure InfSA, fine-tuned"),
    ):
        curve = result["curves"][key]
        ax.plot([offset + p["step"] for p in curve], [p["val"] for p in curve], color=color, ls="--", label=label)
    ax.scatter([offset], [result["val_loss"]["converted_without_training"]], color="tab:red", zorder=3,
               label="converted, before fine-tuning")  # fmt: skip
    ax.axvline(offset, color="grey", lw=0.5)
    ax.set_xlabel("training step")
    ax.set_ylabel("validation loss (nats per byte)")
    ax.set_yscale("log")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def table(result: dict) -> str:
    v, r = result["val_loss"], result["recipe"]
    threads = f" ({result['threads']} threads)" if "threads" in result else ""
    total = r["pretrain_steps"] + r["finetune_steps"]
    rows = [
        ("softmax, trained from scratch", r["pretrain_steps"], v["softmax"]),
        ("converted to pure InfSA, no training", r["pretrain_steps"], v["converted_without_training"]),
        ("converted, fine-tuned", total, v["converted_fine_tuned"]),
        ("softmax, trained for the same extra steps", total, v["softmax_same_extra_steps"]),
    ]
    lines = [
        f"{result['model']}, on {result['text']['bytes'] // 1024} KB of {result['text']['source']}; seed "
        f"{result['seed']}, batch {r['batch']}, AdamW lr {r['lr']}; {result['minutes']:.1f} min of wall time on this "
        f"machine's CPU{threads}. "
        "Validation loss in nats per byte (uniform guessing: 5.55).",
        "",
        "| model | steps | val loss |",
        "|---|---|---|",
    ]
    lines += [f"| {name} | {steps} | {loss:.3f} |" for name, steps, loss in rows]
    cost = v["converted_without_training"] - v["softmax"]
    recovered = v["converted_without_training"] - v["converted_fine_tuned"]
    gap = v["converted_fine_tuned"] - v["softmax_same_extra_steps"]
    lines += [
        "",
        f"Swapping softmax for pure InfSA on the same weights costs {cost:.3f} nats per byte; {r['finetune_steps']} "
        f"fine-tuning steps recover {recovered:.3f} of it, and the converted model ends {gap:+.3f} from the softmax "
        "model given the same extra steps (one seed: no interval).",
    ]
    return "\n".join(lines)


def publish(out: Path, docs: Path, result: dict) -> None:
    folder = docs / "lm"
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(out / "results.json", folder / "results.json")
    shutil.copy(out / "curves.png", folder / "curves.png")
    block = f"{BEGIN}\n{table(result)}\n\n![validation loss](lm/curves.png)\n{END}"
    replace_between(docs / "results.md", BEGIN, END, block)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="runs/lm-experiment")
    parser.add_argument("--text-kb", type=int, default=400)
    parser.add_argument("--pretrain", type=int, default=1200)
    parser.add_argument("--finetune", type=int, default=400)
    parser.add_argument("--every", type=int, default=50, help="steps between validation losses")
    parser.add_argument("--gamma-init", type=float, default=0.9)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--publish", default=None, help="docs folder to write results.json, figure and table into")
    parser.add_argument("--report-only", action="store_true", help="reuse OUT/results.json instead of training")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.report_only:
        result = json.loads((out / "results.json").read_text())
    else:
        result = run(args)
        (out / "results.json").write_text(json.dumps(result, indent=2))
    curves_figure(result, out / "curves.png")
    print(table(result))
    if args.publish:
        publish(out, Path(args.publish), result)


if __name__ == "__main__":
    main()
