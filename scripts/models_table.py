"""Rewrite the params and GMACs columns of README.md's model table from `linvit models --macs --json`.

The table's descriptive columns (mixer, layers, width, heads) are written by hand; its numbers are the
command's, so they cannot drift from it (issue 39: a hand-copied 10.33 where the command says 10.546).
Models whose name ends in _448 are counted at 448 px, the rest at 224.

    python scripts/models_table.py README.md
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
from pathlib import Path

ROW = re.compile(r"^\| `(?P<name>[\w:]+)` \|(?P<middle>.*)\| [\d,]+ \| [\d.]+(?P<at> \(@\d+\))? \|$")


def counts(pattern: str, img_size: int) -> dict[str, dict]:
    """{model: {"params", "gmacs"}} of the models matching pattern, from `linvit models --macs --json`."""
    argv = ["linvit", "models", "--filter", pattern, "--macs", "--json", "--macs-at", str(img_size)]
    rows = json.loads(subprocess.run(argv, check=True, capture_output=True, text=True).stdout)
    return {row["model"]: {"params": row["params"], "gmacs": row[f"gmacs@{img_size}"]} for row in rows}


HEADER = "| model | mixer | layers | width | heads | params | GMACs @224 |"


def rewrite(text: str, numbers: dict[str, dict]) -> str:
    """The rows of the table under HEADER with the command's params and GMACs (2 decimals); nothing else."""
    lines, in_table = [], False
    for line in text.splitlines():
        in_table = line == HEADER or (in_table and line.startswith("|"))
        match = ROW.match(line) if in_table else None
        if match and match["name"] in numbers:
            n = numbers[match["name"]]
            line = f"| `{match['name']}` |{match['middle']}| {n['params']:,} | {n['gmacs']:.2f}{match['at'] or ''} |"
        lines.append(line)
    return "\n".join(lines) + ("\n" if text.endswith("\n") else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("readme", type=Path)
    path = parser.parse_args().readme
    text = path.read_text()
    numbers = {name: n for name, n in counts("*", 224).items() if not name.endswith("_448")}
    numbers.update(counts("*_448", 448))
    path.write_text(rewrite(text, numbers))


if __name__ == "__main__":
    main()
