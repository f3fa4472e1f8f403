"""Linearize a pretrained softmax model by distillation: ``linvit distill`` and ``linvit.distill(...)``.

- teacher.py   the teacher from a timm name, run folder, torchvision or Hugging Face model (vision or causal LM)
- student.py   the student (a converted copy of the teacher) and what trains in it (converted layers, LoRA)
- transfer.py  attention transfer: each converted layer against its teacher layer, on the teacher's input
- text.py      text as token windows for language models
- task.py      the two stages as Tasks on the one trainer (linvit.engine.fit), DistillConfig, run_distill
"""

from __future__ import annotations

import torch.nn as nn

from ..errors import UsageError
from .student import make_student
from .task import DEFAULT_MIXER, STAGES, Distillation, DistillConfig, run_distill
from .teacher import Teacher, load_teacher


def distill(teacher: str, data: str, output: str, mixer: str = DEFAULT_MIXER, **options) -> nn.Module:
    """Distil the teacher (a timm name, run folder, ``torchvision:NAME`` or ``hf:PATH``) into a student whose
    attention is ``mixer`` (linvit.convert's variants; "auto": the best measured for the teacher's kind,
    distillation.recipe), on data (an image dataset, or text for a language
    model); OUT becomes a run folder. options are DistillConfig's fields (epochs, lr, transfer_epochs,
    lora_rank, ...). Returns the student, in eval mode."""
    return run_distill(DistillConfig(teacher=teacher, data=data, output=output, mixer=mixer, **options))


def rebuild_student(args: dict) -> nn.Module:
    """A distilled student's architecture (no weights) from its run's stored config: for linvit.load_run."""
    config = DistillConfig.from_mapping(args)
    if config.mixer == "auto":
        raise UsageError("a distilled student's args name its mixer (--mixer auto is chosen when the run starts)")
    teacher = load_teacher(config.teacher, None, False, config.model_kwargs, config.img_size)
    return make_student(teacher.model, config.mixer, config.gamma_init, config.feature_dim, config.window)


__all__ = [
    "STAGES",
    "DistillConfig",
    "Distillation",
    "Teacher",
    "distill",
    "load_teacher",
    "make_student",
    "rebuild_student",
    "run_distill",
]
