"""The student of `linvit distill`: a copy of the teacher with its attention converted, and what trains in it.

Stage 1 (attention transfer) trains the converted layers only; stage 2 (end to end) trains every parameter,
or LoRA adapters (peft) on the linear layers but the classifier head plus the InfSA discounts.
"""

from __future__ import annotations

import copy

import torch.nn as nn

from ..conversion import convert_if_asked
from ..errors import UsageError
from .transfer import layer_pairs

DISCOUNTS = ("theta", "infsa_theta")  # the InfSA discount of a converted layer (gamma = sigmoid(theta))


def make_student(teacher: nn.Module, mixer: str) -> nn.Module:
    """A deep copy of the teacher with every attention layer converted to mixer (linvit.convert's variants)."""
    student = copy.deepcopy(teacher).requires_grad_(True)
    convert_if_asked(student, mixer)
    return student


def train_only_converted_layers(teacher: nn.Module, student: nn.Module) -> None:
    """Stage 1: freeze the student but its converted layers (their projections and discounts)."""
    student.requires_grad_(False)
    for _, _, layer in layer_pairs(teacher, student):
        layer.requires_grad_(True)


def _head(model: nn.Module) -> nn.Module | None:
    if hasattr(model, "get_classifier"):
        return model.get_classifier()
    if hasattr(model, "get_output_embeddings"):
        return model.get_output_embeddings()
    return None


def _is_linear(module: nn.Module) -> bool:
    return isinstance(module, nn.Linear) or type(module).__name__ == "Conv1D"  # GPT-2's transposed linear


def with_lora(student: nn.Module, rank: int) -> nn.Module:
    """peft's LoRA (rank, alpha = rank) on every linear layer but the head; the discounts train too."""
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError as err:
        raise UsageError('--lora-rank needs peft: pip install -e ".[distill]"') from err
    head = _head(student)
    targets = [name for name, m in student.named_modules() if _is_linear(m) and m is not head and name]
    if not targets:
        raise UsageError("--lora-rank: the student has no linear layer to adapt")
    config = LoraConfig(r=rank, lora_alpha=rank, lora_dropout=0.0, target_modules=targets)
    model = get_peft_model(student, config)
    for name, param in model.named_parameters():
        if name.rsplit(".", 1)[-1] in DISCOUNTS:
            param.requires_grad_(True)
    return model


def merged(student: nn.Module) -> nn.Module:
    """The plain student: LoRA adapters folded into their layers (peft's merge_and_unload), else itself."""
    return student.merge_and_unload() if hasattr(student, "merge_and_unload") else student
