"""TorchScript guards only where TorchScript is supported and tested (issue 47.3).

Eager-only code in linvit sits under ``if not torch.jit.is_scripting():`` (layers/graph_capture.py says why).
Such a guard belongs only in code that a scripted model compiles: every family and every converted form script
(docs/export.md, tests/test_export.py), and anywhere else the guard is dead weight. This test scripts one model
of each kind in a fresh interpreter (TorchScript caches what it compiled once per process), records every
function TorchScript compiles, and fails on a guard in a function none of them reached.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import linvit

ROOT = Path(linvit.__file__).parent

SCRIPT = """
import inspect, json, sys, warnings
import torch.jit._recursive as R, torch.jit._script as S, torch.jit.frontend as F
compiled, original = set(), F.get_jit_def

def spy(fn, *args, **kwargs):
    target = getattr(fn, "__func__", fn)
    lines, start = inspect.getsourcelines(target)
    compiled.add((inspect.getsourcefile(target), start, start + len(lines) - 1))
    return original(fn, *args, **kwargs)

R.get_jit_def = S.get_jit_def = F.get_jit_def = spy
warnings.simplefilter("ignore")  # PyTorch deprecates TorchScript
import timm, torch, linvit
models = [
    timm.create_model("infvit_tiny_patch16_224", depth=1),
    timm.create_model("linear_infvit_tiny_patch16_224", depth=1),
    timm.create_model("katz_infvit_tiny_patch16_224", depth=1, feature_map="hedgehog"),
    timm.create_model("weightformer_tiny_patch16_224", depth=1, dynamic_interval=1),
    linvit.convert(timm.create_model("deit_tiny_patch16_224", depth=1), "linear_attention"),
]
for model in models:
    torch.jit.script(model.eval())
json.dump(sorted(compiled), sys.stdout)
"""


def _guards() -> list[tuple[Path, int, int, int]]:
    """(file, guard line, first and last line of the function holding it) for every is_scripting() test."""
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        tree = ast.parse(path.read_text())
        functions = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]
        for node in ast.walk(tree):
            if isinstance(node, ast.If) and "is_scripting" in ast.dump(node.test):
                holder = min(
                    (f for f in functions if f.lineno <= node.lineno <= f.end_lineno),
                    key=lambda f: f.end_lineno - f.lineno,
                )
                found.append((path.resolve(), node.lineno, holder.lineno, holder.end_lineno))
    return found


def test_every_torchscript_guard_is_in_code_a_scripted_model_compiles():
    result = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    compiled = [(Path(f).resolve(), first, last) for f, first, last in json.loads(result.stdout)]
    guards = _guards()
    assert len(guards) > 20  # the walker finds them
    dead = [
        f"{path.relative_to(ROOT.resolve())}:{line}"
        for path, line, start, end in guards
        if not any(f == path and first <= start and end <= last for f, first, last in compiled)
    ]
    assert dead == [], f"guards in code no scripted model compiles (remove them): {dead}"
