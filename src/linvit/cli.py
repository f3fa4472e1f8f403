"""The `linvit` command line: one subcommand per task, each with --help and a one-line error on bad input."""

from __future__ import annotations

import argparse
import json
import sys


def _cmd_models(args: argparse.Namespace) -> None:
    """Print linvit's registered models with parameter counts (and GMACs at --img-size with --macs)."""
    import timm
    import torch

    from linvit import list_models

    names = list_models(args.filter)
    if not names:
        raise SystemExit(f"linvit models: no model matches {args.filter!r}")
    rows = []
    for name in names:
        model = timm.create_model(name).eval()
        row = {"model": name, "params": sum(p.numel() for p in model.parameters())}
        if args.macs:
            from torch.utils.flop_counter import FlopCounterMode

            with torch.no_grad(), FlopCounterMode(display=False) as counter:
                model(torch.zeros(1, 3, args.img_size, args.img_size))
            row[f"gmacs@{args.img_size}"] = round(counter.get_total_flops() / 2e9, 3)
        rows.append(row)
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    for row in rows:
        print("  ".join(f"{v:,}" if isinstance(v, int) else str(v) for v in row.values()))


def _csv(kind):
    def parse(text: str) -> list:
        try:
            return [kind(item) for item in text.split(",") if item]
        except ValueError as err:
            raise argparse.ArgumentTypeError(f"expected a comma-separated list of {kind.__name__}: {text!r}") from err

    return parse


def _parse_kwargs(pairs: list[str]) -> dict:
    """['k=v', ...] -> {k: v} with v parsed as JSON when possible (numbers, true/false), else a string."""
    out = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"expected key=value, got {pair!r}")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out


def _cmd_bench(args: argparse.Namespace) -> None:
    """Sweep models x resolutions, one subprocess per point; write bench.{json,csv,md} and scaling.png."""
    from pathlib import Path

    from linvit.bench import ladder, split_name, sweep, write_outputs

    for spec in args.models:
        split_name(spec)  # fail fast on an unknown variant
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise ValueError("--device cuda requested but torch sees no CUDA device")
    common = dict(
        batch=args.batch, mode=args.mode, device=args.device, dtype=args.dtype, warmup=args.warmup, iters=args.iters,
        model_kwargs=_parse_kwargs(args.model_kwargs),
    )  # fmt: skip
    extra = {"command": "linvit " + " ".join(sys.argv[1:])}
    if args.ladder:
        records, best = ladder(args.models, args.res[0], common, args.timeout, args.mem_limit)
        extra["ladder_max_res"] = best
    else:
        records = sweep(args.models, args.res, common, args.timeout, args.mem_limit)
    slopes = write_outputs(records, Path(args.out), extra, reference=args.reference)
    print((Path(args.out) / "bench.md").read_text())
    for model, slope in slopes.items():
        print(f"scaling exponent (latency ~ tokens^k) {model}: {'n/a' if slope is None else f'{slope:.3f}'}")
    for model, res in extra.get("ladder_max_res", {}).items():
        print(f"largest resolution that ran {model}: {res if res else 'none'}")
    print(f"wrote {args.out}/bench.json, bench.csv, bench.md, scaling.png")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="linvit", description=__doc__)
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("models", help="list registered models with parameter counts")
    p.add_argument("--filter", default="", help="wildcard filter, e.g. '*linear*'")
    p.add_argument("--macs", action="store_true", help="also count multiply-accumulates (torch flop counter)")
    p.add_argument("--img-size", type=int, default=224, help="input side for --macs (default 224)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=_cmd_models)

    p = sub.add_parser("bench", help="speed / memory / FLOPs / energy sweep, one subprocess per point")
    p.add_argument(
        "--models", type=_csv(str), required=True, help="comma list; 'name:variant' e.g. vit_4l_patch16_224:naive"
    )
    p.add_argument("--res", type=_csv(int), default=[224, 512, 1024], help="comma list of square input sides")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--mode", choices=["infer", "train"], default="infer", help="forward only, or forward+backward")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--dtype", choices=["fp32", "bf16", "fp16"], default="fp32", help="non-fp32 runs under autocast")
    p.add_argument("--warmup", type=int, default=1, help="untimed iterations (the first also counts FLOPs)")
    p.add_argument("--iters", type=int, default=5, help="timed iterations")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per point before it is recorded as timeout")
    p.add_argument("--mem-limit", type=float, default=None, help="GB per point; above it the point is 'oom'")
    p.add_argument("--ladder", action="store_true", help="per model, double the first --res until a point fails")
    p.add_argument("--reference", default=None, help="model whose latency the others are compared with (speed-up)")
    p.add_argument("--model-kwargs", nargs="*", default=[], metavar="K=V", help="extra timm.create_model kwargs")
    p.add_argument("--out", required=True, help="output folder")
    p.set_defaults(func=_cmd_bench)
    return parser


def _version() -> str:
    from linvit import __version__

    return __version__


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        args.func(args)
    except ValueError as err:  # bad input surfaces as one line, not a traceback
        print(f"linvit {args.command}: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
