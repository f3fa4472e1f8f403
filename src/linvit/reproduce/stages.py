"""Run a plan's stages in order, reusing the ones an earlier run finished, with a progress bar and time left.

A stage is reused when its marker (OUT/.stages/<name>.json) says "done" for the very same command, every
output it must leave exists and parses, and every input it reads from an earlier stage (a run's weights) has
the content it had then (sha256): an evaluation of weights that were retrained since is
stale, whatever its command line says. A stage that was started with another command (say
--quick, then the full recipe into the same OUT) is cleared first; an interrupted training stage
keeps its last.pth and resumes from it (`linvit train --resume auto`).
"""

from __future__ import annotations

import hashlib
import json
import shlex
import shutil
import time
from pathlib import Path

from tqdm import tqdm

from .plan import Stage

MARKERS = ".stages"
TARGET_FLAGS = ("--output", "--out", "--json")


def command(stage: Stage) -> str:
    return "linvit " + shlex.join(stage.argv)


def _marker(out: Path, stage: Stage) -> Path:
    return out / MARKERS / (stage.name.replace("/", "__") + ".json")


def output_ok(path: Path) -> bool:
    """The file exists and reads back as what its suffix promises."""
    if not path.is_file() or path.stat().st_size == 0:
        return False
    try:
        if path.suffix == ".json":
            json.loads(path.read_text())
        elif path.suffix == ".jsonl":
            [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        elif path.suffix == ".safetensors":
            from safetensors import safe_open

            with safe_open(str(path), "pt") as f:
                f.keys()
        elif path.suffix in (".npy", ".npz"):
            import numpy as np

            np.load(path)
    except Exception:  # noqa: BLE001 - any unreadable output means: run the stage again
        return False
    return True


def finished(out: Path, stage: Stage, check_inputs: bool = True) -> bool:
    """The stage's marker says done for this command, its outputs read back and (check_inputs) its inputs
    still have the content it read; without check_inputs nothing is hashed (a cheap guess for estimates)."""
    marker = _marker(out, stage)
    try:
        record = json.loads(marker.read_text())
    except (OSError, json.JSONDecodeError):
        return False
    return (
        record.get("status") == "done"
        and record.get("argv") == stage.argv
        and all(output_ok(out / o) for o in stage.outputs)
        and (not check_inputs or not stage.inputs or record.get("inputs") == input_fingerprints(out, stage))
    )


def input_fingerprints(out: Path, stage: Stage) -> dict[str, str | None]:
    """{input: sha256 of its bytes} of the files a stage reads (None for a missing one): content, not
    modification times, which a rewrite within one clock tick leaves unchanged."""
    prints: dict[str, str | None] = {}
    for name in stage.inputs:
        try:
            digest = hashlib.sha256()
            with open(out / name, "rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):  # noqa: B023 - f is this iteration's file
                    digest.update(block)
            prints[name] = digest.hexdigest()
        except OSError:
            prints[name] = None
    return prints


def target(stage: Stage) -> Path | None:
    """The file or folder a stage writes (the value of its --output/--out/--json flag)."""
    for flag in TARGET_FLAGS:
        if flag in stage.argv:
            return Path(stage.argv[stage.argv.index(flag) + 1])
    return None


def _write_marker(out: Path, stage: Stage, **fields) -> None:
    marker = _marker(out, stage)
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text(json.dumps({"name": stage.name, "argv": stage.argv, "command": command(stage), **fields}))


def _prepare(out: Path, stage: Stage) -> None:
    """Clear what an earlier, different command left behind; keep a same-command partial run (resume)."""
    try:
        previous = json.loads(_marker(out, stage).read_text())
    except (OSError, json.JSONDecodeError):
        previous = None
    path = target(stage)
    if previous is not None and previous.get("argv") != stage.argv and path is not None and path.exists():
        tqdm.write(f"{stage.name}: settings changed since the last run, starting this stage over")
        shutil.rmtree(path) if path.is_dir() else path.unlink()


def _fmt_seconds(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


def recorded_timings(out: Path, stages: list[Stage]) -> dict[str, dict]:
    """The timings of the stages finished earlier, as run_stages reports reused ones (for --report-only)."""
    timings = {}
    for stage in stages:
        if finished(out, stage):
            seconds = json.loads(_marker(out, stage).read_text()).get("seconds")
            timings[stage.name] = {"seconds": seconds, "reused": True, "command": command(stage)}
    return timings


class TimeLeft:
    """The estimated seconds of the stages still to run, scaled by this machine's pace so far (measured over
    the estimates of the stages that ran, once they add up to a minute). A stage done in under a tenth of its
    estimate (a training resumed near its end) says nothing about the pace and is left out of it."""

    PACE_SHARE = 0.1

    def __init__(self, estimated: float) -> None:
        self.remaining, self.spent, self.estimated_done = estimated, 0.0, 0.0

    def ran(self, seconds: float, estimate: float, counted: bool = True) -> None:
        """A stage took seconds against its estimate; counted: its estimate is part of `remaining`."""
        if seconds >= self.PACE_SHARE * estimate:
            self.spent += seconds
            self.estimated_done += estimate
        self.remaining -= estimate if counted else 0

    def seconds(self) -> float:
        pace = self.spent / self.estimated_done if self.estimated_done >= 60 else 1.0
        return max(0.0, self.remaining * pace)


def run_stages(out: Path, stages: list[Stage], execute) -> dict[str, dict]:
    """Run (or reuse) every stage via execute(argv); returns {name: {"seconds", "reused", "command"}}."""
    timings: dict[str, dict] = {}
    reuse = {s.name for s in stages if finished(out, s, check_inputs=False)}  # for the time estimate only
    time_left = TimeLeft(sum(s.est_s for s in stages if s.name not in reuse))
    bar = tqdm(
        total=len(stages),
        unit="stage",
        dynamic_ncols=True,
        bar_format="reproduce {n_fmt}/{total_fmt} stages |{bar:24}| {elapsed} elapsed{postfix}",
    )
    try:
        for stage in stages:
            if finished(out, stage):  # judged at its turn: a stage before it may have rewritten its inputs
                record = json.loads(_marker(out, stage).read_text())
                timings[stage.name] = {"seconds": record.get("seconds"), "reused": True, "command": command(stage)}
                tqdm.write(f"reusing {stage.name} (finished earlier, outputs checked)")
                bar.update(1)
                continue
            bar.set_postfix_str(f"about {_fmt_seconds(time_left.seconds())} left; now {stage.name}")
            tqdm.write(f"== {stage.name}: {command(stage)}")
            _prepare(out, stage)
            _write_marker(out, stage, status="running")
            inputs = input_fingerprints(out, stage)  # what this run reads, before it reads it
            start = time.perf_counter()
            execute(stage.argv)
            seconds = time.perf_counter() - start
            missing = [o for o in stage.outputs if not output_ok(out / o)]
            if missing:
                raise RuntimeError(f"stage {stage.name} finished without writing {', '.join(missing)}")
            _write_marker(out, stage, status="done", seconds=seconds, inputs=inputs)
            timings[stage.name] = {"seconds": seconds, "reused": False, "command": command(stage)}
            time_left.ran(seconds, stage.est_s, counted=stage.name not in reuse)
            tqdm.write(f"done {stage.name} in {_fmt_seconds(seconds)}")
            bar.update(1)
    finally:
        bar.close()
    return timings
