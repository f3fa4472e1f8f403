"""The student of `linvit distill`: a copy of the teacher with its attention converted, and what trains in it.

Stage 1 (attention transfer) trains the converted layers only (their learned feature maps only under the
attention-weight loss alone); stage 2 (end to end) trains every parameter, or the converted layers whole plus
LoRA adapters (peft) on every other linear layer but the heads.
"""

from __future__ import annotations

import copy

import torch.nn as nn

from ..conversion import convert_if_asked
from ..errors import UsageError
from ..layers.feature_maps import HedgehogFeatureMap
from ..mixers import get_mixer
from .transfer import layer_pairs


def make_student(
    teacher: nn.Module, mixer: str, gamma_init: float = 0.9, feature_dim: int | None = None, window: int | None = None
) -> nn.Module:
    """A deep copy of the teacher with every attention layer converted to mixer (linvit.convert's variants, its
    feature_dim and, for causal language models, its sliding window)."""
    student = copy.deepcopy(teacher).requires_grad_(True)
    if not get_mixer(mixer.partition(":")[0], warn=False).discount:
        gamma_init = 0.9  # never read; distill's own warning (task.unused_discount_warning) says it is ignored
    convert_if_asked(student, mixer, gamma_init, feature_dim, window or None)  # a stored 0: no window
    return student


def train_only_converted_layers(teacher: nn.Module, student: nn.Module) -> None:
    """Stage 1: freeze the student but its converted layers (their projections and discounts)."""
    student.requires_grad_(False)
    for _, _, layer in layer_pairs(teacher, student):
        layer.requires_grad_(True)


def train_only_feature_maps(teacher: nn.Module, student: nn.Module) -> None:
    """Stage 1 under the attention-weight loss alone (transfer_loss "xent"): only the converted layers' learned
    feature maps train, Hedgehog's setup (the loss reaches nothing else a DDP run could reduce)."""
    student.requires_grad_(False)
    for _, _, layer in layer_pairs(teacher, student):
        for module in layer.modules():
            if isinstance(module, HedgehogFeatureMap):
                module.requires_grad_(True)


HEAD_NAMES = ("heads", "head", "classifier", "lm_head")  # torchvision, timm, Hugging Face classifier heads


def _heads(model: nn.Module) -> set[nn.Module]:
    """The output layers, which LoRA leaves alone: timm's classifier, a language model's output embeddings, and
    the modules torchvision and Hugging Face name heads / classifier."""
    found = set()
    if hasattr(model, "get_classifier"):
        found.add(model.get_classifier())
    if hasattr(model, "get_output_embeddings") and model.get_output_embeddings() is not None:
        found.add(model.get_output_embeddings())
    for name in HEAD_NAMES:
        if isinstance(getattr(model, name, None), nn.Module):
            found |= set(getattr(model, name).modules())
    return found


def _is_linear(module: nn.Module) -> bool:
    return isinstance(module, nn.Linear) or type(module).__name__ == "Conv1D"  # GPT-2's transposed linear


def with_lora(student: nn.Module, rank: int, converted: list[nn.Module]) -> nn.Module:
    """peft's LoRA (rank, alpha = rank) on every linear layer but the heads and the converted layers, which train
    whole: they are the new mixer, and linvit's InfSA layers read their projections' weights directly (a LoRA
    wrapper there would never run)."""
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError as err:
        raise UsageError('--lora-rank needs peft: pip install -e ".[distill]"') from err
    skip = _heads(student) | {m for layer in converted for m in layer.modules()}
    targets = [name for name, m in student.named_modules() if _is_linear(m) and m not in skip and name]
    if not targets:
        raise UsageError("--lora-rank: the student has no linear layer to adapt outside its heads and mixers")
    model = get_peft_model(student, LoraConfig(r=rank, lora_alpha=rank, lora_dropout=0.0, target_modules=targets))
    for layer in converted:
        layer.requires_grad_(True)
    return model


def merged(student: nn.Module) -> nn.Module:
    """The plain student: LoRA adapters folded into their layers (peft's merge_and_unload), else itself."""
    return student.merge_and_unload() if hasattr(student, "merge_and_unload") else student
