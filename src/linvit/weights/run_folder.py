"""What a run folder says about its weights: its config.json (the ``linvit`` section, timm's model_args,
which weights model.safetensors holds) and its args.yaml (the command that trained it), read so that
`eval --checkpoint RUN` and friends rebuild the run's own model without being told its name.

Run folders are written by linvit.utils.artifacts; every folder written since config.json existed loads here
(tests/fixtures/run_v0_* are folders of that first format).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TypeVar

from ..config import Config
from ..errors import UsageError
from ..utils.artifacts import CONFIG, WEIGHTS

ARGS = "args.yaml"
LAST = "last.pth"  # a run's training checkpoint (engine.resume.CHECKPOINT, a tier above)
# what defines the model in a run's args.yaml: taken from the run when no model is named
MODEL_ARGS = ("model", "model_kwargs", "convert", "pyramid_channels", "head_channels")
MODEL_ARGS += ("detector", "min_size", "max_size", "anchor_base")  # detection: the detector and its resize
# input settings taken from the run when not given
INPUT_ARGS = ("img_size", "crop_pct")

C = TypeVar("C", bound=Config)


def check_exists(path: str | Path) -> Path:
    """path as a Path; a one-line error naming it when nothing is there (a typo, or a run not trained yet)."""
    path = Path(path)
    if not path.exists():
        raise UsageError(f"{path}: no such file or folder")
    return path


def read_run_config(path: str | Path) -> tuple[Path, dict] | None:
    """(run folder, its config.json) when path is a linvit run folder or a file inside one, else None; a path
    that does not exist is an error here, so that no caller reports it as "not a run folder"."""
    path = check_exists(path)
    folder = path if path.is_dir() else path.parent
    config = folder / CONFIG
    if not config.is_file():
        return None
    try:
        data = json.loads(config.read_text())
    except json.JSONDecodeError as err:
        raise UsageError(f"{config}: not valid JSON ({err})") from err
    return (folder, data) if isinstance(data, dict) and "linvit" in data else None


def run_model_args(path: str | Path) -> dict:
    """The timm model_args a classification run was built with (img_size, num_classes, ...), {} for a file
    outside a run folder or a run timm did not build (segmentation, detection, generation)."""
    found = read_run_config(path)
    return dict(found[1].get("model_args") or {}) if found else {}


def saved_weights_kind(checkpoint: str | Path) -> str | None:
    """ "ema" or "model" for a run's model.safetensors (from its config.json), None when unknown."""
    found = read_run_config(checkpoint)
    if found is None or Path(checkpoint).name != WEIGHTS:
        return None
    return found[1]["linvit"].get("weights")


def run_args(folder: Path) -> dict:
    """The run's args.yaml as a mapping ({} when empty): what its command was given."""
    import yaml

    return yaml.safe_load((folder / ARGS).read_text()) or {}


def use_run_folder(config: C) -> tuple[C, Path | None]:
    """(config, run folder) for `... eval --checkpoint RUN` (or a file in RUN): a folder means its
    model.safetensors, and without a model name the model is rebuilt from the run's args.yaml (name, kwargs,
    conversion, head widths, and the input size and split (its val split) unless given). The run folder is None
    when the checkpoint is not in one. config is any command's Config with ``checkpoint`` and ``model`` fields; a
    new one is returned.
    """
    if not config.checkpoint:
        if config.model is None:
            raise UsageError("--model is required without --checkpoint")
        return config, None
    path, changes = check_exists(config.checkpoint), {}
    if path.is_dir():
        if not (path / WEIGHTS).is_file():
            if _is_distill_run(path):
                raise UsageError(_distill_state(path, path))
            raise UsageError(f"{path}: no {WEIGHTS} in this folder (a run that has not finished? pass its last.pth)")
        changes["checkpoint"] = str(path / WEIGHTS)
    checkpoint = changes.get("checkpoint", config.checkpoint)
    folder = Path(checkpoint).parent
    if Path(checkpoint).name == LAST and _is_distill_run(folder):  # the distillation's state, not a model's weights
        raise UsageError(_distill_state(Path(checkpoint), folder))
    if not (folder / ARGS).is_file():
        if config.model is None:
            raise UsageError(f"--model is required: {checkpoint} is not in a linvit run folder (no {ARGS})")
        return config.replace(**changes), None
    run, names = run_args(folder), config.field_names()
    for key in (MODEL_ARGS if config.model is None else ()) + INPUT_ARGS:
        if key in run and key in names and (key in MODEL_ARGS or getattr(config, key) is None):
            changes[key] = run[key]
    if "split" in names and config.split is None and run.get("val_split"):  # the split the run validated on
        changes["split"] = run["val_split"]
    if config.model is None and "model" not in run:
        changes.update(_timm_folder_model(folder, config))
        if "model" not in changes:  # no timm config.json (yet): nothing names the model
            if _is_distill_run(folder):
                raise UsageError(_distill_state(Path(checkpoint), folder))
            raise UsageError(f"--model is required: {folder / ARGS} names no model")
    return config.replace(**changes), folder


def _is_distill_run(folder: Path) -> bool:
    """A `linvit distill` run folder: its args.yaml names a teacher (and no model: the student is made from it)."""
    return (folder / ARGS).is_file() and "teacher" in run_args(folder) and "model" not in run_args(folder)


def _distill_state(checkpoint: Path, folder: Path) -> str:
    """Where a distill run's student is, for a path that is not one: the run's model.safetensors once finished,
    else its finished attention-transfer stage or the run resumed to its end (last.pth holds the whole
    distillation's state, teacher and all, not a model's weights)."""
    if (folder / WEIGHTS).is_file():
        return f"{checkpoint}: the state of a `linvit distill` run, not a model's weights: evaluate the run ({folder})"
    stage = folder / "attention" / WEIGHTS
    finished = f"evaluate its finished attention-transfer stage ({stage.parent}), or " if stage.is_file() else ""
    run = folder.parent if folder.name == "attention" and run_args(folder).get("stages") == "both" else folder
    resume = "resume it" if run == folder else f"resume the run it is the first stage of ({run})"
    return (
        f"{checkpoint}: a `linvit distill` run that has not finished has no student to evaluate ({WEIGHTS} is "
        f"written at its end; its last.pth holds the whole distillation's state): {finished}{resume} with "
        "--resume auto to finish it"
    )


def check_run_labels(folder: Path | None, data, **labels) -> None:
    """The data's labels (num_classes=, label_names=, category_ids=) are the ones the run at folder recorded in its
    config.json: a model scored on other classes reads its own labels as the data's (a renamed COCO category,
    reordered classes) or fails to load with a shape error. Nothing to check for a checkpoint outside a run
    folder, or for a run that has not finished (config.json is written at its end)."""
    found = read_run_config(folder) if folder is not None else None
    if found is None:
        return
    recorded = {**found[1], **found[1]["linvit"]}  # label_names sits beside timm's keys, the rest under "linvit"
    for key, value in labels.items():
        if key in recorded and _as_list(recorded[key]) != _as_list(value):
            what = key.replace("num_", "number of ").replace("_", " ")
            raise UsageError(
                f"{data}: {what} {_difference(recorded[key], value)} ({found[0] / CONFIG}): a model scores only the "
                "classes it was trained on; evaluate it on data labelled the same way"
            )


def _difference(run, data) -> str:
    """Where the data's labels depart from the run's: the values when short, else the first that differs."""
    run, data = _as_list(run), _as_list(data)
    if len(run) <= 8 and len(data) <= 8:
        return f"{_shown(data)}, the run's {_shown(run)}"
    i = next(i for i in range(max(len(run), len(data))) if _at(run, i) != _at(data, i))
    return f"at {i} {_at(data, i)!r}, the run's {_at(run, i)!r}"


def _shown(values: list):
    return values[0] if len(values) == 1 else values


def _at(values: list, i: int):
    return values[i] if i < len(values) else None


def _as_list(value) -> list:
    return list(value) if isinstance(value, list | tuple) else [value]


def _timm_folder_model(folder: Path, config: Config) -> dict:
    """The model of a run whose args.yaml names none (`linvit distill`: the student is a converted copy of its
    teacher) from the timm config.json it wrote: its architecture, model_args (size and classes come from the
    checkpoint, see create_for_checkpoint) and, unless given, the input size and crop it was trained with."""
    found = read_run_config(folder)
    if found is not None and "architecture" not in found[1] and found[1]["linvit"].get("task") == "distillation":
        raise UsageError(
            f"{folder}: a torchvision or Hugging Face student, not a timm model: load it with linvit.load_run"
        )
    if found is None or "architecture" not in found[1]:
        return {}
    data, names = found[1], config.field_names()
    kwargs = {k: v for k, v in (data.get("model_args") or {}).items() if k not in ("img_size", "num_classes")}
    changes = {"model": data["architecture"], **({"model_kwargs": kwargs} if "model_kwargs" in names else {})}
    trained = data.get("pretrained_cfg") or {}
    if "input_size" in trained and "img_size" in names and getattr(config, "img_size", None) is None:
        height, width = trained["input_size"][1:]
        changes["img_size"] = height if height == width else [height, width]  # as a run's args.yaml holds it
    if "crop_pct" in trained and "crop_pct" in names and getattr(config, "crop_pct", None) is None:
        changes["crop_pct"] = trained["crop_pct"]
    return changes
