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
