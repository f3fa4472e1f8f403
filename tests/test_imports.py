"""Imports run one way: ops <- layers <- models <- data/utils <- engines <- applications <- reproduce <- cli.

Walks every module's import statements (ast, nothing is executed) and fails on an import from a higher
tier, on two application packages importing each other, on a private name imported across packages, and on an
import circle between modules (one held apart by an import inside a function counts too, unless that import
keeps an optional dependency optional: OPTIONAL_EDGES). Every public name imports on its own.
"""

from __future__ import annotations

import ast
from pathlib import Path

import linvit

ROOT = Path(linvit.__file__).parent
TIERS = {
    "errors": 0,
    "hub_offline": 0,  # standard library and huggingface_hub only: models and weights both use it
    "ops": 0,
    "config": 0,
    "mixers": 0,
    "layers": 1,
    "models": 2,
    "data": 3,
    "utils": 3,
    "distributed": 3,
    "conversion": 3,
    "classify": 4,
    "train": 4,  # linvit.classify's deprecated spelling
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
    "prediction": 6,
    "inference": 6,  # the deprecated name of prediction, re-exporting it
    "demo": 6,
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
    (fake / "ops" / "bad.py").write_text("from ..classify import run\nfrom ..layers._x import y\n")
    monkeypatch.setattr(__import__(__name__), "ROOT", fake)
    problems = _violations()
    assert any("ops (tier 0) imports classify" in p for p in problems)
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


# imports inside functions that close a circle and may: they keep an optional dependency optional
OPTIONAL_EDGES = {("linvit.conversion.language", "linvit.conversion.language_katz")}  # transformers


def _module_name(path: Path, root: Path) -> str:
    parts = ("linvit", *path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_module(name: str, root: Path) -> bool:
    rel = Path(*name.split(".")[1:])
    return (root / rel).with_suffix(".py").is_file() or (root / rel / "__init__.py").is_file()


def _import_graph(root: Path) -> dict[str, set[str]]:
    """{module: the linvit modules it imports, anywhere in it}; importing a.b.c imports the packages a.b and a
    too (the root package, always imported first, is left out)."""
    graph = {}
    for path in sorted(root.rglob("*.py")):
        me = _module_name(path, root)
        package = me if path.name == "__init__.py" else me.rpartition(".")[0]
        targets = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found = [a.name for a in node.names if a.name.startswith("linvit.")]
            elif isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").split(".")[0] == "linvit"):
                base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
                module = ".".join(base + ([node.module] if node.module else []))
                found = [f"{module}.{a.name}" if _is_module(f"{module}.{a.name}", root) else module for a in node.names]
            else:
                continue
            for target in found:
                parts = target.split(".")
                ancestors = (".".join(parts[:i]) for i in range(2, len(parts) + 1))
                targets |= {a for a in ancestors if not (me == a or me.startswith(a + "."))}
        graph[me] = targets - {me}
    return graph


def _circle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle of the graph (its modules, the first repeated at the end), or None."""
    done, path = set(), []

    def visit(node: str) -> list[str] | None:
        if node in path:
            return path[path.index(node) :] + [node]
        if node in done:
            return None
        path.append(node)
        found = next((c for c in map(visit, sorted(graph.get(node, ()))) if c), None)
        path.pop()
        done.add(node)
        return found

    return next((c for c in map(visit, sorted(graph)) if c), None)


def test_no_import_circle():
    graph = _import_graph(ROOT)
    for module, target in OPTIONAL_EDGES:
        assert target in graph[module], f"{module} no longer imports {target}: drop it from OPTIONAL_EDGES"
        graph[module].discard(target)
    assert _circle(graph) is None


def test_the_circle_finder_sees_a_circle_through_a_function(tmp_path):
    fake = tmp_path / "linvit"
    (fake / "conversion").mkdir(parents=True)
    (fake / "conversion" / "__init__.py").write_text("")
    (fake / "conversion" / "core.py").write_text("from .timm_model import x\n")
    (fake / "conversion" / "timm_model.py").write_text("def f():\n    from .core import convert\n")
    circle = _circle(_import_graph(fake))
    assert circle == ["linvit.conversion.core", "linvit.conversion.timm_model", "linvit.conversion.core"]


def test_every_public_name_imports_and_no_module_needs_another_imported_first():
    """`from linvit import X` for each name of linvit.__all__ (the lazy ones load there), and the conversion
    modules that once formed a circle, and the registry, each as a fresh interpreter's first import."""
    import subprocess
    import sys

    names = "\n".join(f"from linvit import {name}" for name in linvit.__all__)
    for code in (names, "import linvit.conversion.timm_model", "import linvit.mixers"):
        result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        assert result.returncode == 0, f"{code[:60]}: {result.stderr.strip().splitlines()[-1:]}"
