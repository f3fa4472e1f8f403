"""Issue 44's speed evidence: the sliding-window hybrid's prefill time and decode tokens/s against softmax with a KV
cache, at 512 to 8,192 tokens of context, in one run on one machine (so the ratios compare like with like).

    python scripts/hybrid_timing.py                              # writes docs/bench/hybrid_decode.json
    python scripts/hybrid_timing.py --contexts 512 1024 --out /tmp/h.json     # a quick check
    python scripts/hybrid_timing.py --report-only --publish docs # the table in docs/benchmarks.md from the JSON

One GPT-2 shape (4 layers, width 128, 4 heads, vocab 256, random weights; scripts/distill_experiment.py's timing
model) as softmax, converted to the hybrid (`katz_infsa:hedgehog`, window 64), to LoLCATs' form
(`linear_attention:hedgehog`, window 64) and to plain causal Katz-InfSA. Per context: the prefill of the prompt
into a fresh cache, and 32 greedy tokens decoded from it after one untimed step (each the best of 3 rounds that
take every form in turn), and the bytes the cache holds after the decode. One thread, batch 1.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from distill_experiment import _cache_bytes  # noqa: E402  (scripts/distill_experiment.py: the same cache count)

from linvit.reproduce.report import replace_between  # noqa: E402

CONTEXTS = (512, 1024, 2048, 4096, 8192)
WINDOW = 64
NEW_TOKENS = 32
BEST_OF = 3
# name -> (linvit.convert variant, window); None: the softmax teacher itself
FORMS = {
    "softmax": (None, None),
    "katz_infsa:hedgehog + window": ("katz_infsa:hedgehog", WINDOW),
    "lolcats (linear_attention:hedgehog + window)": ("linear_attention:hedgehog", WINDOW),
    "katz_infsa": ("katz_infsa", None),
}
JSON = Path("docs/bench/hybrid_decode.json")
BEGIN, END = "<!-- hybrid:begin -->", "<!-- hybrid:end -->"


def models(max_context: int) -> dict:
    """Every form of one random GPT-2 (the same weights: each conversion starts from a fresh copy of seed 0)."""
    import transformers

    import linvit

    shape = dict(vocab_size=256, n_positions=max_context + NEW_TOKENS + 1, n_embd=128, n_layer=4, n_head=4)
    out = {}
    for name, (variant, window) in FORMS.items():
        torch.manual_seed(0)  # a config of its own: a conversion marks the model's config as converted
        model = transformers.GPT2LMHeadModel(transformers.GPT2Config(**shape, bos_token_id=0, eos_token_id=0)).eval()
        out[name] = model if variant is None else linvit.convert(model, variant, window=window)
    return out


@torch.no_grad()
def once(model, prompt: torch.Tensor) -> dict:
    """One prefill into a fresh cache, one untimed greedy step, then NEW_TOKENS timed ones."""
    import transformers

    cache = transformers.DynamicCache(config=model.config)
    start = time.perf_counter()
    token = model(prompt, cache=cache, use_cache=True).logits[:, -1:].argmax(-1)
    prefill = time.perf_counter() - start
    token = model(token, cache=cache, use_cache=True).logits[:, -1:].argmax(-1)  # warm-up
    start = time.perf_counter()
    for _ in range(NEW_TOKENS):
        token = model(token, cache=cache, use_cache=True).logits[:, -1:].argmax(-1)
    decode = time.perf_counter() - start
    return {"prefill_seconds": prefill, "decode_seconds": decode, "cache_bytes": _cache_bytes(cache)}


def measure(contexts) -> dict:
    """Per context, BEST_OF rounds of every form in turn (so a change in the machine's load hits all forms
    alike); each point keeps its best prefill and its best decode."""
    from linvit.bench.machine import cpu_info

    rows, forms, load = [], models(max(contexts)), os.getloadavg()[0]
    for context in contexts:
        prompt = torch.randint(0, 256, (1, context), generator=torch.Generator().manual_seed(context))
        runs = {name: [] for name in forms}
        for _ in range(BEST_OF):
            for name, model in forms.items():
                runs[name].append(once(model, prompt))
        for name, tries in runs.items():
            rows.append(
                {
                    "form": name,
                    "context": context,
                    "prefill_seconds": min(r["prefill_seconds"] for r in tries),
                    "decode_tokens_per_second": NEW_TOKENS / min(r["decode_seconds"] for r in tries),
                    "cache_bytes": tries[-1]["cache_bytes"],
                }
            )
            r = rows[-1]
            print(
                f"{name:46s} {context:5d} tokens: prefill {r['prefill_seconds']:.3f} s, "
                f"decode {r['decode_tokens_per_second']:.1f} tokens/s, cache {r['cache_bytes']:,} B",
                flush=True,
            )
    for name in forms:  # the linear forms' decode state must not grow with the context (softmax's cache does)
        sizes = {r["cache_bytes"] for r in rows if r["form"] == name}
        if name != "softmax" and len(sizes) != 1:
            raise SystemExit(f"{name}: the cache grew with the context ({sorted(sizes)} bytes)")
    return {
        "model": "GPT-2 shape: 4 layers, width 128, 4 heads, vocab 256 (random weights)",
        "window": WINDOW,
        "new_tokens": NEW_TOKENS,
        "best_of": BEST_OF,
        "batch": 1,
        "threads": torch.get_num_threads(),
        "cpu_model": cpu_info()["cpu_model"],
        "cpu_cores": os.cpu_count(),
        "load_average_at_start": load,
        "load_average_at_end": os.getloadavg()[0],
        "torch": torch.__version__,
        "python": platform.python_version(),
        "rows": rows,
    }


def table(record: dict) -> str:
    """Per form and context: prefill s, decode tokens/s, cache KiB, each with its ratio to softmax's."""
    softmax = {r["context"]: r for r in record["rows"] if r["form"] == "softmax"}
    lines = [
        "| form | context | prefill (s) | vs softmax | decode (tokens/s) | vs softmax | cache (KiB) | vs softmax |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in record["rows"]:
        s = softmax[r["context"]]
        ratios = [r[k] / s[k] for k in ("prefill_seconds", "decode_tokens_per_second", "cache_bytes")]
        lines.append(
            f"| {r['form']} | {r['context']:,} | {r['prefill_seconds']:.3f} | {ratios[0]:.2f} | "
            f"{r['decode_tokens_per_second']:.1f} | {ratios[1]:.2f} | "
            f"{r['cache_bytes'] / 1024:,.0f} | {ratios[2]:.2f} |"
        )
    load = " to ".join(f"{record[k]:.2f}" for k in ("load_average_at_start", "load_average_at_end"))
    busy = "a loaded machine: " if record["load_average_at_start"] > 0.5 * record["cpu_cores"] else ""
    lines += [
        "",
        f"{record['model']}; window {record['window']}; batch {record['batch']}, {record['threads']} thread(s); "
        f"CPU {record['cpu_model']} ({busy}{record['cpu_cores']} cores, load average {load} over the run); "
        f"torch {record['torch']}. Prefill and decode: best of {record['best_of']}; decode: "
        f"{record['new_tokens']} greedy tokens after the prompt (and one untimed). Ratios are to softmax "
        "(transformers' GPT-2 with its KV cache) at the same context in the same run. "
        "`python scripts/hybrid_timing.py --publish docs`",
    ]
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--contexts", type=int, nargs="+", default=list(CONTEXTS))
    p.add_argument("--out", default=str(JSON), help="the JSON this run writes (default docs/bench/...)")
    p.add_argument("--report-only", action="store_true", help="render --out's JSON without measuring")
    p.add_argument("--publish", default=None, metavar="DOCS", help="write the table into DOCS/benchmarks.md")
    args = p.parse_args()
    torch.set_num_threads(1)
    out = Path(args.out)
    if not args.report_only:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(measure(sorted(args.contexts)), indent=2) + "\n")
    record = json.loads(out.read_text())
    print(table(record))
    if args.publish:
        replace_between(Path(args.publish) / "benchmarks.md", BEGIN, END, f"{BEGIN}\n{table(record)}\n{END}")


if __name__ == "__main__":
    main()
