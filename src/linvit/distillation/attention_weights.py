"""Hedgehog's attention-weight loss for attention transfer (`DistillConfig.transfer_loss` "xent", "mse+xent").

Hedgehog (arXiv 2402.04347) trains a feature map so that the student's attention weights match the softmax
teacher's, by a soft-label cross-entropy over keys per query and head: CE_i = -sum_j A_soft[i,j] log A_lin[i,j].
The loss here is that CE less the teacher's entropy (the KL divergence: the same gradients, 0 at a match).
Alone ("xent") it trains the learned maps only (student.train_only_feature_maps), Hedgehog's stage.

What each form's weights are (row-stochastic, read from the layer's own queries, keys and features):
- linear attention: A_lin[i,j] = phi(q_i).phi(k_j) / (sum_j' phi(q_i).phi(k_j') + eps), exactly its output's;
- Katz-InfSA (and `katz_rows`): the one-hop operator of its series, row-normalised, which is the same
  expression. The series' effective matrix (I - gamma A)^-1 - I is not row-stochastic (its row sums are the
  Katz out-degrees, set by gamma; `katz_rows` divides by them), and under a causal mask needs an N x N
  triangular solve per head; the map only enters it through A, every hop applies A, and the output MSE fits
  the hops' mix;
- causal language students: the sums run over j <= i; with a window W, keys i-W < j <= i weigh exp(s_ij)
  (the layer's softmax scores) and older ones phi(q_i).phi(k_j), one normaliser (ops.window_causal's y_t).
The teacher's weights are softmax(q k^T * scale) of the teacher layer's own queries and keys (vision: the
converted layer's projections as converted, a frozen copy; language: recorded in the teacher's attention call),
so training the student's projections never moves the target.

Memory: the N x N weights per head are formed where N <= FULL_MAX_TOKENS; above, each layer draws QUERY_BLOCK
queries per step uniformly without replacement (an unbiased estimate of the full mean, O(QUERY_BLOCK N) memory).
Every product and sum runs in float32 (float64 for float64 inputs) with autocast off.
"""

from __future__ import annotations

import contextlib
import copy
import math
import sys
from dataclasses import dataclass
from functools import partial

import torch
import torch.nn as nn

from ..errors import UsageError
from ..layers.feature_maps import LEARNED_FEATURE_MAPS
from ..layers.infsa_attention import KatzInfSAAttention
from ..layers.linear_attention import LinearAttention
from ..ops.common import accumulation_dtype, no_autocast
from ..ops.katz import feature_map as fixed_feature_map

TRANSFER_LOSSES = ("mse", "xent", "mse+xent")
WEIGHT_FORMS = ("linear_attention", "katz_infsa", "katz_rows")  # the forms with row-stochastic weights
NO_WEIGHTS = {
    "pure_infsa": "its scores are normalised over the whole map (Frobenius), not per query",
    "linear_infsa": "every query receives the same pooled summary",
}
FULL_MAX_TOKENS = 1024  # N x N weights per head up to this many tokens
QUERY_BLOCK = 256  # queries drawn per layer and step above it
MIN_WEIGHT = 1e-12  # a student weight's floor inside the log (LoLCATs'): ReLU features can give exact zeros
EPS = 1e-6  # the forms' normaliser eps (layers' and ops' default); a vision layer's own eps is recorded
TAP = "_linvit_weight_tap"  # the attribute a converted language layer's attention call reports through
TEACHER_ATTENTION = "linvit_weight_tap"


def check_transfer_loss(transfer_loss: str, mixer: str | None) -> None:
    """One line for a loss that is not one of TRANSFER_LOSSES, or a weight loss for a form without weights
    (mixer None: the form is not chosen yet, the name alone is checked)."""
    if transfer_loss not in TRANSFER_LOSSES:
        raise UsageError(f"transfer_loss must be one of {', '.join(TRANSFER_LOSSES)}, got {transfer_loss!r}")
    if mixer is None:
        return
    form, _, option = mixer.partition(":")
    if "xent" in transfer_loss and form not in WEIGHT_FORMS:
        why = NO_WEIGHTS.get(form, "it has no row-stochastic attention weights")
        forms = WEIGHT_FORMS if transfer_loss != "xent" else [f"{f}:{LEARNED_FEATURE_MAPS[0]}" for f in WEIGHT_FORMS]
        raise UsageError(
            f"transfer_loss {transfer_loss!r} matches attention weights, which {form} has not ({why}): "
            f"use it with {' or '.join(forms)}, or transfer_loss 'mse'"
        )
    if transfer_loss == "xent" and option not in LEARNED_FEATURE_MAPS:
        raise UsageError(
            f"transfer_loss 'xent' trains the learned feature maps alone (Hedgehog's stage), which {mixer} has not: "
            f"use {form}:{LEARNED_FEATURE_MAPS[0]}, or transfer_loss 'mse+xent'"
        )


def query_rows(tokens: int, device) -> torch.Tensor | None:
    """The queries a layer's loss reads this step: all (None) up to FULL_MAX_TOKENS, else QUERY_BLOCK drawn
    uniformly without replacement (every query equally likely: the mean over them is unbiased)."""
    if tokens <= FULL_MAX_TOKENS:
        return None
    return torch.randperm(tokens, device=device)[:QUERY_BLOCK].sort().values


def _positions(rows: torch.Tensor | None, tokens: int, device) -> torch.Tensor:
    return torch.arange(tokens, device=device) if rows is None else rows


def _rows(t: torch.Tensor, rows: torch.Tensor | None) -> torch.Tensor:
    return t if rows is None else t.index_select(2, rows)


def teacher_log_weights(q, k, scale: float, causal: bool, rows=None) -> torch.Tensor:
    """log softmax(q k^T scale) of the queries rows (None: all), (B, H, R, N), keys j > i masked when causal."""
    dtype = accumulation_dtype(q)
    scores = _rows(q, rows).to(dtype) @ k.to(dtype).transpose(-2, -1) * scale
    if causal:
        i = _positions(rows, q.shape[2], q.device)
        scores = scores.masked_fill(torch.arange(k.shape[2], device=q.device) > i[:, None], float("-inf"))
    return torch.log_softmax(scores, dim=-1)


def student_log_weights(
    fq, fk, causal: bool, rows=None, window=None, q=None, k=None, scale=None, eps: float = EPS
) -> torch.Tensor:
    """log A_lin of the queries rows, (B, H, R, N), floored at log MIN_WEIGHT (future keys -inf): phi(q_i).phi(k_j)
    normalised over the keys (j <= i when causal) with the layer's eps; with a window W, exp(q_i.k_j scale) on
    i-W < j <= i, one normaliser."""
    dtype = accumulation_dtype(fq)
    products = _rows(fq, rows).to(dtype) @ fk.to(dtype).transpose(-2, -1)  # (B, H, R, N)
    j = torch.arange(fk.shape[2], device=fk.device)
    i = _positions(rows, fq.shape[2], fq.device)[:, None]
    floor = math.log(MIN_WEIGHT)
    if window is None:
        if causal:
            products = products.masked_fill(j > i, 0.0)
        weights = products / (products.sum(-1, keepdim=True) + eps)
        logs = torch.log(weights.clamp_min(MIN_WEIGHT))
        return logs.masked_fill(j > i, float("-inf")) if causal else logs
    scores = _rows(q, rows).to(dtype) @ k.to(dtype).transpose(-2, -1) * scale
    older = torch.log(products.clamp_min(torch.finfo(dtype).tiny))  # the clamp keeps log's gradient finite at 0
    logs = torch.where((j <= i) & (j > i - window), scores, torch.where(j <= i - window, older, float("-inf")))
    return (logs - torch.logsumexp(logs, dim=-1, keepdim=True)).clamp_min(floor).masked_fill(j > i, float("-inf"))


def cross_entropy(teacher_log: torch.Tensor, student_log: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(CE, H): the mean over batch, heads and queries of -sum_j p_ij log a_ij and of the teacher's entropy
    (masked keys, p = 0 and log a = -inf, add 0)."""
    p = teacher_log.exp()
    seen = p > 0
    ce = -torch.where(seen, p * student_log, 0.0).sum(-1).mean()
    return ce, -torch.where(seen, p * teacher_log, 0.0).sum(-1).mean()


@dataclass
class Recorded:
    """One layer's step: the teacher's queries and keys, the student's raw ones (the window's scores) and features."""

    teacher_q: torch.Tensor | None = None
    teacher_k: torch.Tensor | None = None
    teacher_scale: float | None = None
    q: torch.Tensor | None = None
    k: torch.Tensor | None = None
    fq: torch.Tensor | None = None
    fk: torch.Tensor | None = None
    scale: float | None = None
    window: int | None = None
    causal: bool = False
    eps: float = EPS  # the student layer's normaliser eps


def layer_weight_loss(r: Recorded) -> torch.Tensor:
    """The CE less the teacher's entropy for one layer's recorded step (query blocks above FULL_MAX_TOKENS)."""
    rows = query_rows(r.fq.shape[2], r.fq.device)
    with no_autocast(r.fq):
        with torch.no_grad():
            teacher = teacher_log_weights(r.teacher_q, r.teacher_k, r.teacher_scale, r.causal, rows)
        student = student_log_weights(r.fq, r.fk, r.causal, rows, r.window, r.q, r.k, r.scale, r.eps)
        ce, entropy = cross_entropy(teacher, student)
    return ce - entropy


def _vision_mixer(layer: nn.Module) -> nn.Module | None:
    """The timm-layout mixer of a converted vision layer: the layer itself, or the one a wrapper holds."""
    for m in (layer, getattr(layer, "mixer", None)):
        if isinstance(m, (LinearAttention, KatzInfSAAttention)):
            return m
    return None


def _heads(qkv: nn.Linear, q_norm, k_norm, x: torch.Tensor, heads: int) -> tuple[torch.Tensor, torch.Tensor]:
    """q, k (B, H, N, d) of a timm-layout projection, after its q/k norms."""
    B, N, _ = x.shape
    q, k, _ = qkv(x).reshape(B, N, 3, heads, -1).permute(2, 0, 3, 1, 4).unbind(0)
    return q_norm(q), k_norm(k)


class _VisionLayer:
    """A converted timm-layout layer: its input, queries, keys (after their norms) and features are recorded as its
    forward makes them (no second pass through the projections: under fsdp they are sharded again after the
    forward); the teacher's q, k come from a frozen copy of the projections as converted (the teacher's)."""

    RECORDED = ("q_norm", "k_norm", "feature_q", "feature_k")  # the submodules whose outputs the loss reads

    def __init__(self, mixer: nn.Module) -> None:
        self.mixer = mixer
        self.frozen = copy.deepcopy(nn.ModuleList([mixer.qkv, mixer.q_norm, mixer.k_norm])).requires_grad_(False)
        self.x: torch.Tensor | None = None
        self.outputs: dict[str, torch.Tensor] = {}

    @contextlib.contextmanager
    def active(self):
        m = self.mixer
        handles = [m.register_forward_hook(self._record)]  # after every pre-hook (LayerTaps' input swap)
        handles += [getattr(m, name).register_forward_hook(partial(self._output, name)) for name in self.RECORDED]
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()

    def _record(self, module, args, output) -> None:
        self.x = args[0]

    def _output(self, name: str, module, args, output) -> None:
        self.outputs[name] = output

    def recorded(self) -> Recorded:
        m, x, out = self.mixer, self.x, self.outputs
        self.x, self.outputs = None, {}
        frozen = self.frozen.to(x.device)
        with torch.no_grad():
            tq, tk = _heads(*frozen, x.detach(), m.num_heads)
        q, k = out["q_norm"], out["k_norm"]
        if m.feature_map in LEARNED_FEATURE_MAPS:
            fq, fk = out["feature_q"], out["feature_k"]
        else:  # the fixed map, which the ops apply themselves, in float32
            fq, fk = (fixed_feature_map(t.to(accumulation_dtype(t)), m.feature_map) for t in (q, k))
        return Recorded(tq, tk, m.head_dim**-0.5, q, k, fq, fk, eps=m.eps)


class _LanguageLayer:
    """A converted transformers attention layer: its attention call (conversion/language_katz) reports the raw
    queries, keys and features through TAP; the teacher layer's call through the wrapped teacher attention."""

    def __init__(self, teacher: nn.Module, student: nn.Module) -> None:
        self.teacher, self.student = teacher, student
        self.record = Recorded(causal=True)
        self.original = teacher.config._attn_implementation  # the teacher's layers share one config

    @contextlib.contextmanager
    def active(self):
        config, original = self.teacher.config, self.original
        self.teacher._linvit_attention_original = _attention_function(self.teacher, original)
        setattr(self.teacher, TAP, self._teacher)
        setattr(self.student, TAP, self._student)
        swap = config._attn_implementation != TEACHER_ATTENTION  # the first layer of the model swaps and restores
        if swap:
            _register_teacher_attention(original)
            config._attn_implementation = TEACHER_ATTENTION
        try:
            yield
        finally:
            if swap:
                config._attn_implementation = original
            delattr(self.teacher, TAP), delattr(self.student, TAP)

    def _teacher(self, query, key, scaling) -> None:
        from ..conversion.language import repeat_heads

        r = self.record
        r.teacher_q, r.teacher_k = query.detach(), repeat_heads(key.detach(), query.shape[1])
        r.teacher_scale = scaling if scaling is not None else query.shape[-1] ** -0.5

    def _student(self, query, key, fq, fk, kernel: str, scaling, window) -> None:
        r = self.record
        if kernel != "identity":
            fq, fk = (fixed_feature_map(t.to(accumulation_dtype(t)), kernel) for t in (fq, fk))
        r.q, r.k, r.fq, r.fk, r.window = query, key, fq, fk, window
        r.scale = scaling if scaling is not None else query.shape[-1] ** -0.5

    def recorded(self) -> Recorded:
        r, self.record = self.record, Recorded(causal=True)
        return r


def _attention_function(module: nn.Module, name: str):
    """The attention function a transformers layer calls under implementation name ("eager": its module's)."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    if name == "eager" or name is None:
        return sys.modules[type(module).__module__].eager_attention_forward
    return ALL_ATTENTION_FUNCTIONS[name]


def _teacher_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """The teacher's own attention, after reporting its queries and keys (TAP) where a loss listens."""
    tap = getattr(module, TAP, None)
    if tap is not None:
        tap(query, key, scaling)
    original = module._linvit_attention_original
    return original(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs)


def _register_teacher_attention(original: str) -> None:
    """TEACHER_ATTENTION, with the original implementation's masks (the teacher computes exactly as before)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

    AttentionInterface.register(TEACHER_ATTENTION, _teacher_attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(TEACHER_ATTENTION, ALL_MASK_ATTENTION_FUNCTIONS[original or "eager"])


class WeightTaps:
    """Records what every paired layer's weights need while ``active()``; ``loss()`` is the mean over layers."""

    def __init__(self, pairs: list[tuple[str, nn.Module, nn.Module]]) -> None:
        self.layers = []
        for name, teacher, student in pairs:
            mixer = _vision_mixer(student)
            if mixer is not None:
                self.layers.append(_VisionLayer(mixer))
            elif hasattr(student, "infsa_theta") or getattr(student, "infsa_linear_attention", False):
                self.layers.append(_LanguageLayer(teacher, student))
            else:
                raise UsageError(f"{name}: the attention-weight loss reads linear attention and Katz-InfSA layers only")

    @contextlib.contextmanager
    def active(self):
        with contextlib.ExitStack() as stack:
            for layer in self.layers:
                stack.enter_context(layer.active())
            yield self

    def loss(self) -> torch.Tensor:
        return torch.stack([layer_weight_loss(layer.recorded()) for layer in self.layers]).mean()


__all__ = ["TRANSFER_LOSSES", "WeightTaps", "check_transfer_loss", "cross_entropy"]
