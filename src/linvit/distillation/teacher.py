"""The teacher of `linvit distill`: a pretrained softmax model, from whichever place a user has one.

Spellings of ``--teacher`` (docs/distill.md):
- a timm name (``deit_tiny_patch16_224``), with ``--teacher-file`` weights or ``--pretrained`` (timm's Hub path);
- a linvit run folder (a ``linvit train`` run: the model it trained, at its input size);
- ``torchvision:NAME`` (``torchvision.models.get_model``), weights from ``--teacher-file``;
- ``hf:PATH_OR_ID``: a Hugging Face image classifier or causal language model (``from_pretrained``; a local
  folder offline), its tokenizer when the folder has one.
The teacher is frozen and in eval mode; the student is a converted copy of it (distillation.student).
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import torch
import torch.nn as nn

from ..errors import UsageError
from ..hub_offline import offline_while_hub_unresolvable
from ..models import create_model
from ..weights import check_exists, height_width, load_weights, read_run_config

IMAGENET = {"mean": (0.485, 0.456, 0.406), "std": (0.229, 0.224, 0.225), "interpolation": "bilinear"}


@dataclasses.dataclass
class Teacher:
    model: nn.Module
    language: bool  # a causal language model (token ids in, next-token logits out)
    data_config: dict | None = None  # vision: timm's data config (input_size, mean, std, crop_pct, ...)
    tokenizer: object = None  # language: a Hugging Face tokenizer, or None for bytes
    label_names: list[str] | None = None  # vision: its classes' names in head order, where it names them


def absolute_teacher(spec: str) -> str:
    """spec with a local folder made absolute (a run folder, hf:./model), so that a distilled run rebuilds its
    student from any working directory; names and Hub ids as they are."""
    if spec.startswith("hf:") and Path(spec[3:]).expanduser().exists():
        return "hf:" + str(Path(spec[3:]).expanduser().resolve())
    if not spec.startswith(("hf:", "torchvision:")) and Path(spec).exists():
        return str(Path(spec).resolve())
    return spec


def load_teacher(spec: str, file: str | None = None, pretrained: bool = False, model_kwargs=None, img_size=None):
    """The frozen teacher named by spec (module docstring); file: its weights where the spec has none."""
    if (spec.startswith("hf:") or Path(spec).exists()) and (model_kwargs or img_size):
        raise UsageError(
            f"--teacher {spec} brings its own architecture and input size: --model-kwargs and --img-size go with a "
            "timm or torchvision name"
        )
    if spec.startswith("hf:"):
        teacher = _huggingface(spec[3:], file)
    elif spec.startswith("torchvision:"):
        teacher = _torchvision(spec.split(":", 1)[1], file, img_size, model_kwargs)
    elif Path(spec).exists():
        teacher = _run_folder(spec, file)
    else:
        from ..classify import with_model_kwargs

        kwargs = dict(model_kwargs or {})
        kwargs["pretrained"] = kwargs.get("pretrained", False) or pretrained  # the CLI folds --pretrained in
        own = {"img_size": height_width(img_size), "pretrained_file": file}
        model = create_model(
            spec, **with_model_kwargs(own, kwargs, {"img_size": "--img-size", "pretrained_file": "--teacher-file"})
        )
        teacher = Teacher(model, False, _timm_data_config(model), label_names=_timm_label_names(model))
    teacher.model.eval().requires_grad_(False)
    return teacher


def _timm_label_names(model: nn.Module) -> list[str] | None:
    """The class names a timm pretrained_cfg carries (a run folder's, some Hub models'), else None."""
    names = (getattr(model, "pretrained_cfg", None) or {}).get("label_names")
    return [str(n) for n in names] if names else None


def _timm_data_config(model: nn.Module) -> dict:
    from timm.data import resolve_data_config

    return resolve_data_config({}, model=model)


def _run_folder(path: str, file: str | None) -> Teacher:
    found = read_run_config(path)
    if found is None:
        raise UsageError(f"--teacher {path}: not a linvit run folder (no config.json with a 'linvit' section)")
    folder, config = found
    task = config["linvit"].get("task", "classification")
    if task != "classification" or "architecture" not in config:
        raise UsageError(f"--teacher {path}: a {task} run; a teacher is a classifier (a `linvit train` run)")
    if file is not None:
        raise UsageError("--teacher-file goes with a model name; a run folder brings its own weights")
    import timm

    model = timm.create_model(f"local-dir:{folder}", pretrained=True)
    names = config.get("label_names") or _timm_label_names(model)
    return Teacher(model, False, _timm_data_config(model), label_names=names and [str(n) for n in names])


def _torchvision(name: str, file: str | None, img_size, model_kwargs) -> Teacher:
    import torchvision

    kwargs = {**(model_kwargs or {}), **({"image_size": img_size[0]} if img_size else {})}
    try:
        model = torchvision.models.get_model(name, **kwargs)
    except (ValueError, TypeError) as err:
        raise UsageError(f"--teacher torchvision:{name}: {err}") from err
    if file is not None:
        load_weights(model, file)
    side = getattr(model, "image_size", 224)
    return Teacher(model, False, {**IMAGENET, "input_size": (3, side, side), "crop_pct": 1.0, "crop_mode": "center"})


def _huggingface(name: str, file: str | None) -> Teacher:
    if file is not None:
        raise UsageError("--teacher-file goes with a timm or torchvision model; hf: teachers bring their weights")
    _check_local(name)
    try:
        import transformers  # noqa: F401 - its absence is one line here, not an ImportError deeper down
    except ImportError as err:
        raise UsageError('an hf: teacher needs transformers: pip install -e ".[hf]"') from err
    with offline_while_hub_unresolvable():  # a Hub name offline: huggingface_hub's error at once, not after retries
        return _huggingface_teacher(name)


def _huggingface_teacher(name: str) -> Teacher:
    import transformers

    config = _hf_config(name)
    if _is_causal_lm(config):
        model = transformers.AutoModelForCausalLM.from_pretrained(name)
        return Teacher(model, True, tokenizer=_tokenizer(name))
    model = transformers.AutoModelForImageClassification.from_pretrained(name)
    side = getattr(config, "image_size", 224)
    side = side if isinstance(side, int) else side[0]
    mean, std = _hf_normalisation(name)
    data_config = {**IMAGENET, "mean": mean, "std": std, "input_size": (3, side, side), "crop_pct": 1.0}
    return Teacher(model, False, data_config, label_names=_hf_label_names(config))


def _check_local(name: str) -> None:
    """A local folder, not a Hub id, that is not there is named as a typo (before transformers is needed)."""
    if name.startswith(("/", ".", "~")):
        check_exists(Path(name).expanduser())


def _hf_config(name: str):
    """The transformers configuration of an hf: teacher, or one line naming what is wrong with the name."""
    import transformers

    try:
        return transformers.AutoConfig.from_pretrained(name)
    except OSError as err:
        raise UsageError(f"--teacher hf:{name}: {str(err).splitlines()[0]}") from err


def _is_causal_lm(config) -> bool:
    return any(a.endswith(("ForCausalLM", "LMHeadModel")) for a in config.architectures or [])


def causal_language_teacher(spec: str) -> bool:
    """Whether --teacher names a causal language model, from its configuration alone (no weights read): only
    hf: teachers can be one."""
    if not spec.startswith("hf:"):
        return False
    _check_local(spec[3:])
    try:
        import transformers  # noqa: F401
    except ImportError:
        return False  # load_teacher names a missing folder, then what to install
    return _is_causal_lm(_hf_config(spec[3:]))  # one line on every rank that cannot read it: none decides alone


def _hf_label_names(config) -> list[str] | None:
    """config.id2label in head order, unless it is transformers' placeholder (LABEL_0, LABEL_1, ...)."""
    id2label = getattr(config, "id2label", None) or {}
    names = [str(id2label.get(i, id2label.get(str(i), ""))) for i in range(len(id2label))]
    if not names or all(re.fullmatch(r"LABEL_\d+", n) for n in names):
        return None
    return names


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model")


def _tokenizer(name: str):
    """The model's tokenizer, or None (a folder without tokenizer files): the text is then read as bytes."""
    import transformers

    if Path(name).is_dir() and not any((Path(name) / f).is_file() for f in TOKENIZER_FILES):
        return None
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(name)
    except (OSError, ValueError, TypeError):
        return None
    return tokenizer if len(tokenizer) > 0 else None


def _hf_normalisation(name: str) -> tuple[tuple, tuple]:
    import transformers

    try:
        processor = transformers.AutoImageProcessor.from_pretrained(name)
        return tuple(processor.image_mean), tuple(processor.image_std)
    except (OSError, ValueError, TypeError, AttributeError):
        return IMAGENET["mean"], IMAGENET["std"]


def logits_of(output) -> torch.Tensor:
    """The logits of any model's output: a tensor, or a Hugging Face ModelOutput's .logits."""
    return output if isinstance(output, torch.Tensor) else output.logits


class Logits(nn.Module):
    """model(x) as a logits tensor (Hugging Face models return a ModelOutput), for evaluate_classification."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return logits_of(self.model(x))
