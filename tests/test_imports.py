"""Imports run one way: ops <- layers <- models <- data/utils <- engines <- applications <- reproduce <- cli.

Walks every module's import statements (ast, nothing is executed) and fails on an import from a higher
tier, on two application packages importing each other, and on a private name imported across packages.
"""

from __future__ import annotations

import ast
from pathlib import Path

import linvit

ROOT = Path(linvit.__file__).parent
TIERS = {
    "errors": 0,
    "ops": 0,
    "config": 0,
    "layers": 1,
    "models": 2,
    "data": 3,
    "utils": 3,
    "distributed": 3,
    "conversion": 3,
    "train": 4,
    "engine": 4,
    "weights": 3,
    "onnx_runtime": 3,
    "evaluate": 4,
    "explain": 5,
    "segment": 5,
    "bench": 5,
    "detect": 5,
    "export": 5,
    "generate": 5,
    "distillation": 5,
    "runs": 6,
    "inference": 6,
    "demo": 6,
    "dense_inference": 6,
    "reproduce": 6,
    "cli": 7,
    "__main__": 7,
    "__init__": 7,
}


def _package(module: Path) -> str:
    return module.relative_to(ROOT).parts[0].removesuffix(".py")


def _imports(module: Path):
    """(imported linvit top-level package, imported names) for every linvit import in the module."""
    tree = ast.parse(module.read_text())
    parts = module.relative_to(ROOT).with_suffix("").parts
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against the module's package
                base = list(parts[: len(parts) - node.level])
                target = base + (node.module.split(".") if node.module else [])
            elif node.module and node.module.split(".")[0] == "linvit":
                target = node.module.split(".")[1:]
            else:
                continue
            if not target:  # from . import x  /  from linvit import x
                target = [alias.name for alias in node.names][:1]
            yield target, [alias.name for alias in node.names], node.lineno
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("linvit."):
                    yield alias.name.split(".")[1:], [], node.lineno


def _violations() -> list[str]:
    problems, edges = [], set()
    for module in sorted(ROOT.rglob("*.py")):
        own = _package(module)
        for target, names, line in _imports(module):
            other = target[0]
            where = f"{module.relative_to(ROOT)}:{line}"
            if other == own or other not in TIERS:
                continue
            if TIERS[other] > TIERS[own]:
                problems.append(f"{where}: {own} (tier {TIERS[own]}) imports {other} (tier {TIERS[other]})")
            edges.add((own, other))
            private = [p for p in target[1:] if p.startswith("_")] + [n for n in names if n.startswith("_")]
            if private:
                problems.append(f"{where}: {own} imports the private {'.'.join(target)} {names}")
    problems += [f"{a} and {b} import each other" for a, b in edges if (b, a) in edges and a < b]
    return problems


def test_imports_run_down_the_tiers_only():
    assert _violations() == []


def test_the_walker_sees_a_violation(tmp_path, monkeypatch):
    fake = tmp_path / "linvit"
    (fake / "ops").mkdir(parents=True)
    (fake / "ops" / "bad.py").write_text("from ..train import run\nfrom ..layers._x import y\n")
    monkeypatch.setattr(__import__(__name__), "ROOT", fake)
    problems = _violations()
    assert any("ops (tier 0) imports train" in p for p in problems)
    assert any("private" in p for p in problems)


def test_help_does_not_import_torch():
    """`linvit --help` stays fast: building the parser and printing help import neither torch nor linvit."""
    import subprocess
    import sys

    code = (
        "import sys, contextlib, io, linvit_cli\n"
        "with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n"
        "    linvit_cli.main(['train', '--help'])\n"
        "heavy = sorted(m for m in ('torch', 'timm', 'linvit') if m in sys.modules)\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
