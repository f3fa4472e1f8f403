"""The `linvit` command line, importable as ``linvit.cli``.

The parser lives in the top-level module ``linvit_cli`` so that the `linvit` script can print ``--help`` without
importing this package (which imports torch and timm to register the models); see docs/design.md.
"""

from linvit_cli import build_parser, main, run_command

__all__ = ["build_parser", "main", "run_command"]
