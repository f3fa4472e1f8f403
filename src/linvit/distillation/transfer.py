"""Attention transfer: each converted layer learns to give its teacher layer's output on the teacher's input.

LoLCATs' first stage (arXiv 2410.10254), for any model linvit.convert converts. The pairs are the converted
layers of the student and the layers of the same name in the teacher. While a `LayerTaps` is active, forward
hooks record every paired teacher layer's input and output; with ``substitute=True`` each student layer is
called on its teacher layer's input instead of its own (its other arguments, masks and rotary embeddings, stay
the student's), so the layers learn independently of each other and of the rest of the student.
"""

from __future__ import annotations

import contextlib
from functools import partial

import torch
import torch.nn as nn

from ..conversion import convert_report
from ..errors import UsageError
from .attention_weights import WeightTaps

INPUT_NAMES = ("hidden_states", "x", "query")  # the input's keyword in timm, torch and transformers layers


def layer_pairs(teacher: nn.Module, student: nn.Module) -> list[tuple[str, nn.Module, nn.Module]]:
    """(name, teacher layer, student layer) for every layer linvit.convert converted in the student."""
    report = convert_report(student)
    if not report.converted:
        raise UsageError("the student has no converted attention layer to distil into")
    pairs = []
    for converted in report.converted:
        try:
            pairs.append((converted.name, teacher.get_submodule(converted.name), student.get_submodule(converted.name)))
        except AttributeError as err:
            raise UsageError(f"the teacher has no layer {converted.name!r}: it is not the student's source") from err
    return pairs


def _first_tensor(args: tuple, kwargs: dict) -> torch.Tensor:
    if args and isinstance(args[0], torch.Tensor):
        return args[0]
    for name in INPUT_NAMES:
        if isinstance(kwargs.get(name), torch.Tensor):
            return kwargs[name]
    raise UsageError("cannot find the input tensor of an attention layer (not a timm, torch or transformers layer)")


def _output_tensor(output) -> torch.Tensor:
    return output[0] if isinstance(output, (tuple, list)) else output


class _ZeroThrough(torch.autograd.Function):
    """0 in forward, zeros in backward, for any input (no 0 x inf = NaN at the output itself; a non-finite value
    inside the layer still meets the zeros in its own backward, as any gradient would)."""

    @staticmethod
    def forward(ctx, t: torch.Tensor) -> torch.Tensor:
        ctx.shape, ctx.dtype, ctx.device = t.shape, t.dtype, t.device
        return torch.zeros((), dtype=torch.float32, device=t.device)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        return torch.zeros(ctx.shape, dtype=ctx.dtype, device=ctx.device)


class LayerTaps:
    """Forward hooks on the paired layers, registered only inside ``with taps.active(substitute):``."""

    def __init__(self, pairs: list[tuple[str, nn.Module, nn.Module]], weights: bool = False) -> None:
        """weights: also record what the attention-weight loss reads (attention_weights.WeightTaps; built here,
        before any training, as it keeps a frozen copy of the teacher's projections)."""
        self.pairs = pairs
        self.teacher_in: dict[int, torch.Tensor] = {}
        self.teacher_out: dict[int, torch.Tensor] = {}
        self.student_out: dict[int, torch.Tensor] = {}
        self.weights = WeightTaps(pairs) if weights else None

    @contextlib.contextmanager
    def active(self, substitute: bool):
        with self.weights.active() if self.weights is not None and substitute else contextlib.nullcontext():
            with self._hooks(substitute):
                yield self

    @contextlib.contextmanager
    def _hooks(self, substitute: bool):
        handles = []
        for i, (_, teacher_layer, student_layer) in enumerate(self.pairs):
            handles.append(teacher_layer.register_forward_pre_hook(partial(self._teacher_in, i), with_kwargs=True))
            handles.append(teacher_layer.register_forward_hook(partial(self._record, self.teacher_out, i)))
            if substitute:
                handles.append(student_layer.register_forward_pre_hook(partial(self._swap_in, i), with_kwargs=True))
            handles.append(student_layer.register_forward_hook(partial(self._record, self.student_out, i)))
        try:
            yield self
        finally:
            for handle in handles:
                handle.remove()

    def _teacher_in(self, i: int, module, args, kwargs) -> None:
        self.teacher_in[i] = _first_tensor(args, kwargs)

    def _record(self, store: dict, i: int, module, args, output) -> None:
        store[i] = _output_tensor(output)

    def _swap_in(self, i: int, module, args, kwargs):
        """The student layer's input (every argument that is it: q, k and v of a self-attention) -> the teacher's."""
        own, theirs = _first_tensor(args, kwargs), self.teacher_in[i].detach()
        args = tuple(theirs if a is own else a for a in args)
        kwargs = {k: theirs if v is own else v for k, v in kwargs.items()}
        return args, kwargs

    def loss(self) -> torch.Tensor:
        """Mean over layers of each layer's MSE relative to its teacher output's mean square (so layers of any
        scale weigh alike), in float32; clears the recorded tensors."""
        losses = []
        for i in range(len(self.pairs)):
            student, teacher = self.student_out[i].float(), self.teacher_out[i].detach().float()
            losses.append((student - teacher).pow(2).mean() / teacher.pow(2).mean().clamp_min(1e-12))
        self.teacher_in.clear(), self.teacher_out.clear(), self.student_out.clear()
        return torch.stack(losses).mean()

    def transfer_loss(self, kind: str, through_outputs: bool = False) -> torch.Tensor:
        """Attention transfer's loss (attention_weights.TRANSFER_LOSSES): the relative output MSE (loss()), the
        attention weights' CE less the teacher's entropy (Hedgehog's), or their sum, weighted 1 each.

        through_outputs (fsdp): "xent" alone sends exact zero gradients into every layer's output too, where
        fsdp's pre-backward hook gathers the layer's parameters before the weights' gradients need them."""
        outputs = list(self.student_out.values())
        mse = self.loss()  # also clears the recorded outputs
        if "xent" not in kind:
            return mse
        weights = self.weights.loss()
        if kind != "xent":
            return mse + weights
        return weights + sum(_ZeroThrough.apply(o) for o in outputs) if through_outputs else weights
