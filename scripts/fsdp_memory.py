"""Issue 46's memory benchmark: each rank's parameters + gradients + optimizer state under fsdp against ddp, two
CPU processes (gloo), random weights, a few steps of `linvit train` on the drawn digits.

    python scripts/fsdp_memory.py                       # every row; writes runs/fsdp_memory/summary.json
    python scripts/fsdp_memory.py --rows llama_1b       # one row, the others kept from the last summary
    python scripts/fsdp_memory.py --publish docs        # ... and docs/bench/fsdp_memory.json, the benchmarks.md table

The vision rows are what each `linvit train` run records (config.json: linvit.state_bytes_per_rank, the local
shards under fsdp). The language rows are a transformers Llama of random weights converted with linvit.convert to
causal Katz-InfSA (built on the meta device, each rank drawing only its own shards), trained STEPS steps on
random tokens by a torchrun worker of this script (the same
sharding.prepare, timm AdamW and sharding.state_bytes as the trainer; no `linvit` command trains a language model
without its teacher). Their ddp runs one process: ddp's state per rank is the whole state at any world size, and
two 1B ranks do not fit the 23 GB machine. Every run is watched: its processes' resident memory together must
stay under --limit-gib (the run is killed past it), and the peak is recorded.
The whole model is 16 bytes a parameter under AdamW in float32 (weights, gradients, two moments); fsdp keeps
1/world of it per rank. Activations are not counted (they depend on the batch, not the strategy).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch

from linvit.reproduce.report import replace_between

MODELS = {"infvit_24l_patch16_224": ["--img-size", "64"]}
LANGUAGE = {  # Llama shapes (tied embeddings, full multi-head attention), converted to causal katz_infsa
    # 0.99B parameters: 16 GB of state; its fsdp run (two processes) peaked at 19.1 GiB on the 23 GB machine
    "llama_1b": dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=18, num_attention_heads=16),
    "llama_tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4),
}
VOCAB, TOKENS, STEPS = 32000, 16, 2
BEGIN, END = "<!-- fsdp-memory:begin -->", "<!-- fsdp-memory:end -->"


def train(model: str, extra: list[str], strategy: str, out: Path) -> dict:
    """One two-process run of a few steps; its recorded state bytes per rank and the wall time."""
    argv = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", "29517"]
    argv += ["-m", "linvit", "train", "--data", "digits:digit,canvas=64,length=16", "--model", model, *extra]
    argv += ["--strategy", strategy, "--epochs", "1", "--batch-size", "4", "--workers", "0", "--no-progress"]
    argv += ["--device", "cpu", "--aa", "none", "--mixup", "0", "--cutmix", "0", "--reprob", "0"]
    argv += ["--output", str(out)]
    seconds, peak = watched(argv)
    info = json.loads((out / "config.json").read_text())["linvit"]
    return {"state_bytes_per_rank": info["state_bytes_per_rank"], "seconds": seconds, "peak_rss_bytes": peak}


def train_language(shape: str, strategy: str, out: Path, limit_gib: float = 20.0) -> dict:
    """One torchrun run of the language worker (ddp: one process, fsdp: two); what its rank 0 recorded."""
    processes = 1 if strategy == "ddp" else 2
    argv = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(processes)]
    argv += ["--master_port", "29518", __file__, "--worker", shape, strategy, str(out)]
    seconds, peak = watched(argv, limit_gib)
    record = json.loads(out.read_text())
    return {**record, "processes": processes, "seconds": seconds, "peak_rss_bytes": peak}


def watched(argv: list[str], limit_gib: float = 20.0) -> tuple[float, int]:
    """Run argv; (seconds, peak resident bytes of all its processes together); killed past limit_gib."""
    import psutil

    start, peak = time.perf_counter(), 0
    # blocks of 1 MiB and more mapped apart and unmapped when freed: what is resident is what is live, so the
    # watch measures the run rather than glibc's freed-but-kept heap (it changes no recorded state byte)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MALLOC_MMAP_THRESHOLD_": str(2**20)}
    proc = subprocess.Popen(argv, env=env)
    while proc.poll() is None:
        tree = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
        rss = sum(_rss(p) for p in tree)
        peak = max(peak, rss)
        if rss > limit_gib * 2**30:
            for p in reversed(tree):
                p.kill()
            sys.exit(f"{argv[-4:]}: {rss / 2**30:.1f} GiB resident, over --limit-gib {limit_gib}: stopped")
        time.sleep(0.2)
    if proc.returncode:
        sys.exit(f"{argv[-4:]} failed ({proc.returncode})")
    return round(time.perf_counter() - start, 1), peak


def _rss(process) -> int:
    try:
        return process.memory_info().rss
    except Exception:  # noqa: BLE001 - psutil.NoSuchProcess: a worker that has just ended holds nothing
        return 0


def language_worker(shape: str, strategy: str, record: Path) -> None:
    """Under torchrun: a converted Llama of random weights, prepared for the strategy as the trainer does, STEPS
    AdamW steps on random tokens; rank 0 writes each rank's parameter + gradient + optimizer bytes."""
    from timm.optim import create_optimizer_v2
    from transformers import LlamaConfig, LlamaForCausalLM

    import linvit
    from linvit.distributed import all_reduce_sum, distributed_session
    from linvit.engine import sharding

    with distributed_session("cpu") as (rank, world, device):
        torch.manual_seed(0)
        config = LlamaConfig(**LANGUAGE[shape], vocab_size=VOCAB, tie_word_embeddings=True)
        with torch.device("meta"):  # built without storage, as torchtitan does: no rank holds the whole model
            model = linvit.convert(LlamaForCausalLM(config), "katz_infsa")
        parameters = sum(p.numel() for p in model.parameters())
        plan = SimpleNamespace(strategy=strategy, amp="none", shard_size=None, grad_checkpointing=False)
        model = sharding.prepare(model, plan, world, device)
        random_weights(model.to_empty(device=device), config)
        if not sharding.is_sharded(model):  # to_empty gave the tied output layer its own storage
            model.tie_weights()
        optimizer = create_optimizer_v2(model, opt="adamw", lr=1e-4, weight_decay=0.05)
        tokens = torch.randint(VOCAB, (1, TOKENS), generator=torch.Generator().manual_seed(0))
        for _ in range(STEPS):
            optimizer.zero_grad(set_to_none=True)
            model(input_ids=tokens, labels=tokens).loss.backward()
            optimizer.step()  # the gradients stay: the state at a step's end, as the trainer's runs record it
        mine = sharding.state_bytes(model, optimizer)
        per_rank = all_reduce_sum([mine if r == rank else 0 for r in range(world)], device)
        if rank == 0:
            record.write_text(
                json.dumps({"parameters": parameters, "state_bytes_per_rank": [int(b) for b in per_rank]})
            )
        del model, optimizer


def random_weights(model: torch.nn.Module, config) -> None:
    """Weights for a model materialised from the meta device: each rank draws its own shards only, and the
    rotary tables are made again (to_empty leaves every buffer unset)."""
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    with torch.no_grad():
        for p in model.parameters():
            getattr(p, "_local_tensor", p).normal_(0.0, 0.02)
        rotary = model.model.rotary_emb
        for name, buffer in LlamaRotaryEmbedding(config=config).named_buffers():
            getattr(rotary, name).copy_(buffer)


def measure_row(name: str, out: Path, limit_gib: float = 20.0) -> dict:
    """One table row: fsdp, then ddp (one run resident at a time)."""
    runs = {}
    for strategy in ("fsdp", "ddp"):
        if name in LANGUAGE:
            runs[strategy] = train_language(name, strategy, out / f"{name}_{strategy}.json", limit_gib)
        else:
            runs[strategy] = train(name, MODELS[name], strategy, out / f"{name}_{strategy}")
    row = {"model": name, "ddp": runs["ddp"], "fsdp": runs["fsdp"]}
    if name in LANGUAGE:
        row["parameters"] = row["ddp"]["parameters"]
        row["converted"] = "katz_infsa (causal), random weights"
    row["fsdp_over_ddp"] = max(row["fsdp"]["state_bytes_per_rank"]) / max(row["ddp"]["state_bytes_per_rank"])
    return row


def measure(out: Path, names: list[str], limit_gib: float, published: Path) -> dict:
    """The rows named, measured; the others kept from the last summary, or where there is none (a fresh clone)
    from the published one (rows in MODELS, then LANGUAGE order)."""
    old = next((path for path in (out / "summary.json", published) if path.is_file()), None)
    rows = {r["model"]: r for r in json.loads(old.read_text())["rows"]} if old is not None else {}
    rows |= {name: measure_row(name, out, limit_gib) for name in names}
    order = [*MODELS, *LANGUAGE]
    rows = [rows[name] for name in order if name in rows and name != "llama_tiny"]
    return {"world_size": 2, "backend": "gloo (CPU)", "optimizer": "AdamW, float32", "rows": rows}


def table(record: dict) -> str:
    lines = [
        "| model | ddp state per rank (MiB) | fsdp state per rank (MiB) | fsdp / ddp |",
        "|---|---|---|---|",
    ]
    notes = []
    for row in record["rows"]:
        ddp, fsdp = (row[s]["state_bytes_per_rank"] for s in ("ddp", "fsdp"))
        cells = [" / ".join(f"{b / 2**20:,.0f}" for b in ranks) for ranks in (ddp, fsdp)]
        name = row["model"]
        if "converted" in row:
            name += f" ({row['parameters'] / 1e9:.2f}B, {row['converted']})"
        if row["ddp"].get("processes") == 1:
            cells[0] += " (1 process)"
            notes.append(row["model"])
        lines.append(f"| {name} | {cells[0]} | {cells[1]} | {row['fsdp_over_ddp']:.3f} |")
    if notes:
        gib = {r["model"]: [r[s]["peak_rss_bytes"] / 2**30 for s in ("ddp", "fsdp")] for r in record["rows"]
               if r["model"] in notes}  # fmt: skip
        peaks = ", ".join(f"{name}: ddp {gib[name][0]:.1f}, fsdp {gib[name][1]:.1f}" for name in notes)
        lines += [
            "",
            f"ddp of {', '.join(notes)} ran one process: its state per rank is the whole state at any world size "
            f"(the ddp rows above hold the same on both ranks), and two ranks of it do not fit the 23 GB machine; "
            f"{STEPS} AdamW steps on {TOKENS} random tokens. Peak resident memory of all processes of a run, "
            f"GiB: {peaks}.",
        ]
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="runs/fsdp_memory")
    p.add_argument("--rows", nargs="+", default=[*MODELS, "llama_1b"], choices=[*MODELS, *LANGUAGE])
    # the 1B row's two fsdp processes peaked at 19.1 GiB on the 23 GB machine
    p.add_argument("--limit-gib", type=float, default=20.0, help="resident memory a run may reach (all processes)")
    p.add_argument("--report-only", action="store_true")
    p.add_argument("--publish", default=None, metavar="DOCS")
    p.add_argument("--worker", nargs=3, metavar=("SHAPE", "STRATEGY", "RECORD"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        shape, strategy, record = args.worker
        language_worker(shape, strategy, Path(record))
        return
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if not args.report_only:
        published = Path(args.publish or "docs") / "bench/fsdp_memory.json"
        (out / "summary.json").write_text(json.dumps(measure(out, args.rows, args.limit_gib, published), indent=2))
    record = json.loads((out / "summary.json").read_text())
    print(table(record))
    if args.publish:
        docs = Path(args.publish)
        (docs / "bench/fsdp_memory.json").write_text(json.dumps(record, indent=2))
        replace_between(docs / "benchmarks.md", BEGIN, END, f"{BEGIN}\n{table(record)}\n{END}")


if __name__ == "__main__":
    main()
