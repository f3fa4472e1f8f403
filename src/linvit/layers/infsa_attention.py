"""InfSA token mixers as drop-in `attn_layer`s for timm's VisionTransformer.

Each module keeps timm's Attention parameter layout (qkv, q_norm, k_norm, norm, proj), so timm
tooling (weight init, checkpoint filters, layer-wise lr decay) works unchanged, and adds a per-head
discount gamma = sigmoid(theta) that trains (the reference release freezes it through `.item()`).
Every forward compiles with torch.jit.script (see layers/graph_capture.py). Token-chunked inference streams
through them with ``residual_streamed`` (models/_chunking.py).
"""

# no `from __future__ import annotations`: TorchScript reads FoldedWeights' field types only when they are real types
import math
import numbers
from typing import Literal, NamedTuple, get_args, get_origin

import torch
import torch.nn as nn
import torch.nn.functional as F
from timm.layers import register_notrace_module

from ..errors import UsageError
from ..mixers import Option, register_mixer
from ..ops import katz_infsa, linear_infsa, pure_infsa
from ..ops.common import accumulation_dtype, autocast_dtype, merges_with_next, no_autocast
from ..ops.infsa import (
    LINEAR_VARIANTS,
    LinearVariant,
    importance_from_logits,
    linear_normaliser,
    linear_scores,
    soft_query_from_sums,
    soft_query_sums,
)
from ..ops.katz import feature_dtype, katz_factors, katz_features, katz_mixing, katz_token_sums, mixing_as
from ..ops.katz import feature_map as katz_feature_map
from .feature_maps import LEARNED_FEATURE_MAPS, FeatureMap, query_and_key_maps
from .graph_capture import call_eagerly, is_fx_tracing, stateless_call

torch.fx.wrap("call_eagerly")  # one node per InfSA layer in FX graphs (see graph_capture.call_eagerly)


# Each choice-valued option is a Literal type, the one source of its choices: check_choice validates against it,
# and the conformance matrix enrols every value it names from the layers' and models' signatures.
PureImpl = Literal["auto", "dense", "chunked"]
FoldKV = Literal[True, False]
PURE_IMPLS = get_args(PureImpl)
# eager inference over at least this many tokens projects the soft query's Q in views of QUERY_CHUNK tokens
QUERY_CHUNK_MIN_TOKENS, QUERY_CHUNK = 2**16, 2**14
FEATURE_MAPS = get_args(FeatureMap)
INFSA_MAPS = ("column", "katz", "perron")  # explain's maps of the ReLU(q k^T) and phi(q) phi(k)^T operators


def check_choice(name: str, value: object, choices) -> None:
    """A one-line ValueError at construction for an option a forward would only reject later; choices is a
    tuple or a Literal type (PureImpl, FoldKV, ...)."""
    if get_origin(choices) is Literal:
        choices = get_args(choices)
    if value not in choices:
        raise UsageError(f"{name} must be one of {', '.join(repr(c) for c in choices)}; got {value!r}")


def check_gamma_init(gamma_init: object) -> float:
    """The first discount as a float, or a one-line error unless it is a real number (NumPy's and one-element
    tensors included) in (0, 1): a string or bool would fail later, deep inside a comparison."""
    one_number = isinstance(gamma_init, torch.Tensor) and gamma_init.numel() == 1 and not gamma_init.is_complex()
    if isinstance(gamma_init, bool) or not (isinstance(gamma_init, numbers.Real) or one_number):
        raise UsageError(f"gamma_init must be a number in (0, 1), got {gamma_init!r}")
    value = float(gamma_init)
    if not 0.0 < value < 1.0:
        raise UsageError(f"gamma_init must lie in (0, 1), got {value}")
    if 1.0 - value < 8e-8:  # sigmoid(logit) rounds to 1 in float32 (no tensor here: layers are also built on meta)
        raise UsageError(f"gamma_init {value} is 1 in float32 (the Katz series diverges): give at most 0.9999999")
    return value


def check_feature_map(feature_map: FeatureMap, feature_dim: int | None) -> None:
    """One-line errors for a feature map and its size, before a layer changes anything."""
    check_choice("feature_map", feature_map, FeatureMap)
    if feature_dim is None:
        return
    if feature_map not in LEARNED_FEATURE_MAPS:
        raise UsageError(f"feature_dim sizes a learned feature map ({', '.join(LEARNED_FEATURE_MAPS)}) only")
    if isinstance(feature_dim, bool) or not isinstance(feature_dim, int) or feature_dim < 1:
        raise UsageError(f"feature_dim must be a positive whole number of features, got {feature_dim!r}")


def timm_attention_layout(
    module: nn.Module, dim, num_heads, qkv_bias, qk_norm, scale_norm, proj_bias, proj_drop, norm_layer, kwargs: dict
) -> dict:
    """timm Attention's checks and parameters on module (num_heads, head_dim, qkv, q_norm, k_norm, norm, proj,
    proj_drop), so timm tooling and linvit.convert treat it as timm's. kwargs may hold only device, dtype and
    timm's depth; returns {device, dtype} for the caller's own parameters."""
    if dim % num_heads != 0:
        raise UsageError(f"dim ({dim}) must be divisible by num_heads ({num_heads})")
    if (qk_norm or scale_norm) and norm_layer is None:
        raise UsageError("norm_layer must be given when qk_norm or scale_norm is set")
    dd = {k: kwargs.pop(k) for k in ("device", "dtype") if k in kwargs}
    kwargs.pop("depth", None)
    if kwargs:
        raise TypeError(f"unexpected arguments: {sorted(kwargs)}")
    module.num_heads, module.head_dim = num_heads, dim // num_heads
    module.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias, **dd)
    module.q_norm = norm_layer(module.head_dim, **dd) if qk_norm else nn.Identity()
    module.k_norm = norm_layer(module.head_dim, **dd) if qk_norm else nn.Identity()
    module.norm = norm_layer(dim, **dd) if scale_norm else nn.Identity()
    module.proj = nn.Linear(dim, dim, bias=proj_bias, **dd)
    module.proj_drop = nn.Dropout(proj_drop)
    return dd


class FoldedWeights(NamedTuple):
    """Per-head weights of the folded Linear-InfSA path (see LinearInfSAAttention.folded_weights)."""

    w_q: torch.Tensor  # (C, C)
    b_q: torch.Tensor | None  # (C,)
    w_key: torch.Tensor  # (H, D, C) or (H, D, C + 1) with b_k appended
    w_value: torch.Tensor  # (H, C, D): W_v transposed per head (a view)
    b_value: torch.Tensor | None  # (H, D): b_v (a view)
    gamma: torch.Tensor  # (H,): the discount, applied to the (B, H) normaliser


class InfSABase(nn.Module):
    """Shared projections, per-head learnable discount and output path of the InfSA attentions.

    ``forward`` is the one place the three mixers meet graph capture: under torch.fx.symbolic_trace the layer is
    one node (graph_capture.call_eagerly), otherwise it runs the subclass's ``mix``.
    """

    dead_counts: torch.Tensor | None  # a type TorchScript can read when the attribute is still None

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        qkv_bias: bool = False,
        qk_norm: bool = False,
        scale_norm: bool = False,
        proj_bias: bool = True,
        attn_drop: float = 0.0,
        proj_drop: float = 0.0,
        norm_layer: type[nn.Module] | None = None,
        gamma_init: float = 0.9,
        eps: float = 1e-6,
        **kwargs,
    ) -> None:
        super().__init__()
        gamma_init = check_gamma_init(gamma_init)
        layout = (dim, num_heads, qkv_bias, qk_norm, scale_norm, proj_bias, proj_drop, norm_layer)
        dd = timm_attention_layout(self, *layout, kwargs)
        self.gamma_init = gamma_init
        self.eps = eps
        self.attn_drop = nn.Dropout(attn_drop)
        self.theta = nn.Parameter(torch.empty(num_heads, **dd))
        # dead-head monitor (linvit.engine.DeadHeadStats turns it on while training): per head, the images of the
        # recorded forwards whose scores were all zero, then the image count, added in place on the device to one
        # (H + 1,) tensor that lives across epochs (never read here: no host sync, and compiled graphs see the same
        # tensor and the same flag at every step, so they are not recompiled)
        self.record_dead = False
        self.dead_counts: torch.Tensor | None = None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """gamma = sigmoid(theta) starts at gamma_init in every head (timm's init calls this)."""
        with torch.no_grad():
            self.theta.fill_(math.log(self.gamma_init / (1.0 - self.gamma_init)))

    @property
    def gamma(self) -> torch.Tensor:
        """Per-head discount in (0, 1), shape (H,)."""
        return torch.sigmoid(self.theta)

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None, is_causal: bool = False) -> torch.Tensor:
        if is_fx_tracing() and not torch.jit.is_scripting():
            return call_eagerly(self, x, attn_mask, is_causal)
        return self.mix(x, attn_mask, is_causal)

    def mix(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None, is_causal: bool = False) -> torch.Tensor:
        """The layer's token mixing, (B, N, C) -> (B, N, C) (each mixer defines it)."""
        raise NotImplementedError

    def residual_streamed(self, x: torch.Tensor, spans: list[tuple[int, int]], norm, scale) -> torch.Tensor:
        """x + scale(self(norm(x))) for token-chunked inference over the token spans (no autograd).

        A mixer whose output can be streamed (Linear-InfSA folded, Katz-InfSA) reads norm(x) span by span and
        adds to x in place; this default (pure InfSA's dense scores) mixes the whole normalised input once.
        """
        return x + scale(self(norm(x)))

    def note_dead(self, dead: torch.Tensor) -> None:
        """Add a (B, H) boolean "this head's scores are all zero for this image" to the device-side counts.

        Called where ``record_dead`` is set; it compiles under TorchScript too, so scripted layers record alike."""
        counts = self.dead_counts
        assert counts is not None, "record_dead without DeadHeadStats"
        counts[:-1].add_(dead.sum(0).to(counts.dtype))
        counts[-1:].add_(dead.shape[0])

    def project_qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(B, N, C) -> q, k, v of shape (B, H, N, D), with optional q/k norms."""
        B, N, _ = x.shape
        q, k, v = self.qkv(x).reshape(B, N, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        return self.q_norm(q), self.k_norm(k), v

    def merge_heads(self, out: torch.Tensor) -> torch.Tensor:
        """(B, H, N, D) -> projected (B, N, C)."""
        B, H, N, D = out.shape
        return self.proj_drop(self.proj(self.norm(out.transpose(1, 2).reshape(B, N, H * D))))

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}, head_dim={self.head_dim}, gamma_init={self.gamma_init}"


@register_mixer("pure_infsa", maps=INFSA_MAPS, aliases=("pure",))
@register_notrace_module  # a leaf (one call_module node) in timm's FX feature extraction
class PureInfSAAttention(InfSABase):
    """Pure InfSA: one Frobenius-normalised diffusion hop, gamma * A^ v (quadratic in tokens).

    ``impl`` selects the dense form, the memory-bounded two-pass form, or "auto" (by size).
    """

    def __init__(
        self, dim: int, num_heads: int = 8, *, impl: PureImpl = "auto", block_size: int | None = None, **kwargs
    ):
        check_choice("impl", impl, PureImpl)
        if block_size is not None and (not isinstance(block_size, int) or block_size < 1):
            raise UsageError(f"block_size must be a positive int or None; got {block_size!r}")
        super().__init__(dim, num_heads, **kwargs)
        self.impl = impl
        self.block_size = block_size

    def mix(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None, is_causal: bool = False) -> torch.Tensor:
        q, k, v = self.project_qkv(x)
        if is_causal:
            N = x.shape[1]
            causal = torch.ones(N, N, dtype=torch.bool, device=x.device).tril()
            attn_mask = causal if attn_mask is None else attn_mask & causal
        out = pure_infsa(
            q,
            k,
            v,
            self.gamma,
            self.eps,
            impl=self.impl,
            block_size=self.block_size,
            attn_mask=attn_mask,
            dropout_p=self.attn_drop.p if self.training else 0.0,
        )
        if self.record_dead:  # all scores zero <=> the head's output is all zero
            self.note_dead(out.detach().flatten(2).any(-1).logical_not())
        return self.merge_heads(out)


def token_views(x: torch.Tensor) -> list[torch.Tensor]:
    """x as one chunk, or in eager inference over many tokens as views of QUERY_CHUNK tokens: the soft query's
    Q projection then never holds all N x C at once (1 GB at 8192^2 and width 1024). No copy is made."""
    if not torch.jit.is_scripting():  # eager-only (module constants are not TorchScript values)
        if not (torch.is_grad_enabled() or stateless_call()) and x.shape[1] >= QUERY_CHUNK_MIN_TOKENS:
            return list(x.split(QUERY_CHUNK, dim=1))
    return [x]


@register_mixer(
    "linear_infsa",
    option=Option("linear_variant", LINEAR_VARIANTS, "release"),
    cannot=("attn_mask",),
    maps=("linear", *INFSA_MAPS),
    aliases=("linear",),
)
@register_notrace_module
class LinearInfSAAttention(InfSABase):
    """Linear-InfSA: every token receives the importance-pooled value z (O(N) in tokens).

    With ``fold_kv=True`` (default) the K and V projections are folded into the soft query
    (docs/spec/infsa.md section 3): a_j = ReLU(x_j . W_k^T q_bar + b_k . q_bar) and
    z = W_v (sum_j a_j x_j) + b_v sum_j a_j, so only Q is projected per token and the output
    projection runs once per sample. The result equals the unfolded module; q/k norms break the
    linearity in k, so with ``qk_norm`` the unfolded path is used. ``linear_variant`` selects the score map
    and normaliser (ops.infsa.LINEAR_VARIANTS, docs/spec/infsa.md section 3.1): "release" (default) is the
    paper's; "floor", "softplus" and "elu+1" are linvit's opt-in stabilised forms, on both paths.
    """

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        *,
        fold_kv: FoldKV = True,
        linear_variant: LinearVariant = "release",
        **kwargs,
    ) -> None:
        check_choice("fold_kv", fold_kv, FoldKV)
        check_choice("linear_variant", linear_variant, LinearVariant)
        super().__init__(dim, num_heads, **kwargs)
        self.fold_kv = fold_kv
        self.linear_variant = linear_variant

    def mix(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None, is_causal: bool = False) -> torch.Tensor:
        if attn_mask is not None or is_causal:
            raise ValueError("Linear-InfSA pools all tokens into one state; attention masks are not supported")
        if self.folds():
            return self._forward_folded(x)
        q, k, v = self.project_qkv(x)
        dropout_p = self.attn_drop.p if self.training else 0.0
        out = linear_infsa(q, k, v, self.gamma, self.eps, dropout_p=dropout_p, variant=self.linear_variant)
        if self.record_dead:  # zero importance <=> a zero pooled value
            self.note_dead(out.detach()[:, :, 0].any(-1).logical_not())
        return self.merge_heads(out)

    def folds(self) -> bool:
        """Whether the folded path runs: fold_kv, and no q/k norm (they break the linearity in k)."""
        return self.fold_kv and isinstance(self.k_norm, nn.Identity) and isinstance(self.q_norm, nn.Identity)

    def residual_streamed(self, x: torch.Tensor, spans: list[tuple[int, int]], norm, scale) -> torch.Tensor:
        """The folded path's output is one (B, 1, C) row: two streaming passes over norm(x), added in place."""
        if not self.folds():
            return super().residual_streamed(x, spans, norm, scale)
        return x.add_(scale(self.pooled_output(_Chunks(x, spans, norm))))  # (B, 1, C) broadcast

    def importance(self, x: torch.Tensor) -> torch.Tensor:
        """Token importance a of shape (B, H, N) for the (already normalised) block input x."""
        weights = self.folded_weights()
        q_key = self._query_key(token_views(x), weights)
        with no_autocast(x):
            logits = self._key_logits(x.to(q_key.dtype), q_key, weights).transpose(1, 2)  # (B, H, N)
            return importance_from_logits(logits, self.eps, self.linear_variant)

    def folded_weights(self) -> FoldedWeights:
        """The folded path's per-head weights, derived from the parameters on every call.

        Views of qkv where possible; only W_k with b_k appended is a new tensor, and gamma is applied to the
        (B, H) normaliser, the key side's 1/D to the soft query's scalar scale. Nothing is cached: a cache
        keyed on parameter versions goes stale under ``param.data`` writes (issue 22).
        """
        H, D = self.num_heads, self.head_dim
        C = self.qkv.in_features
        w_q, w_k, w_v = self.qkv.weight.view(3, H, D, C).unbind(0)
        bias = self.qkv.bias
        if bias is None:
            return FoldedWeights(w_q.reshape(H * D, C), None, w_k, w_v.transpose(1, 2), None, self.gamma)
        b_q, b_k, b_v = bias.view(3, H, D).unbind(0)
        return FoldedWeights(
            w_q=w_q.reshape(H * D, C),
            b_q=b_q.reshape(H * D),
            w_key=torch.cat([w_k, b_k[..., None]], dim=-1),  # (H, D, C + 1): the bias as one more input
            w_value=w_v.transpose(1, 2),  # (H, C, D)
            b_value=b_v,  # (H, D)
            gamma=self.gamma,
        )

    def _query_key(self, chunks: list[torch.Tensor], weights: FoldedWeights) -> torch.Tensor:
        """Soft query over all chunks, q_bar / sqrt(D) of shape (B, H, D), so that q_key . k_j = q_bar . k~_j.

        The soft query's two token sums are accumulated chunk by chunk, so the Q projection never
        needs all tokens at once. The key side's 1/sqrt(D) is folded into the soft query's scalar scale.
        """
        num: torch.Tensor | None = None
        den: torch.Tensor | None = None
        for xc in chunks:
            B, n, _ = xc.shape
            q = F.linear(xc, weights.w_q, weights.b_q).view(B, n, self.num_heads, self.head_dim)
            part_num, part_den = soft_query_sums(q)
            num = part_num if num is None else num + part_num
            den = part_den if den is None else den + part_den
        assert num is not None and den is not None, "no token chunks"
        return soft_query_from_sums(num, den, self.eps, scale=self.head_dim**0.5)

    def _key_logits(self, xa: torch.Tensor, q_key: torch.Tensor, weights: FoldedWeights) -> torch.Tensor:
        """q_bar . k~_j for every token of xa, shape (B, n, H), without projecting K: x_j . u + c.

        u = W_k^T q_key and c = b_k . q_key come from one (H, B, D) x (H, D, C + 1) product.
        """
        C = xa.shape[-1]
        u = torch.bmm(q_key.transpose(0, 1), weights.w_key.to(q_key.dtype)).permute(1, 2, 0)  # (B, C or C + 1, H)
        if u.shape[1] == C:
            return torch.bmm(xa, u)
        return torch.baddbmm(u[:, C:], xa, u[:, :C])

    def pooled_output(self, chunks: list[torch.Tensor]) -> torch.Tensor:
        """The mixer output shared by every token, (B, 1, C), from a re-iterable of input chunks.

        Under autocast it is returned in the autocast dtype, as every mixer's output (the output projection,
        an autocast matmul in timm's Attention); otherwise in the input's dtype. Two streaming passes (soft
        query, then importance-weighted sums), with K and V folded:
        z = (W_v sum_j a_j x_j + b_v sum_j a_j) / ((sum_j a_j + eps) / gamma), a_j = ReLU(logit_j).
        Only O(B H C) state is kept between chunks, so memory is bounded by the chunk size.
        """
        weights = self.folded_weights()
        q_key = self._query_key(chunks, weights)  # the Q projection itself may run under autocast
        if not torch.jit.is_scripting():
            out_dtype = autocast_dtype(q_key)  # every mixer's contract: what timm's Attention returns
            with no_autocast(q_key):  # the output projection in the weights' dtype
                z = self._pooled_value(chunks, q_key, weights)
                out = self.proj(self.norm(z.to(self.proj.weight.dtype)))
                return out.to(z.dtype if out_dtype is None or z.dtype == torch.float64 else out_dtype)
        return self.proj(self.norm(self._pooled_value(chunks, q_key, weights)))

    def _pooled_value(self, chunks: list[torch.Tensor], q_key: torch.Tensor, weights: FoldedWeights) -> torch.Tensor:
        """pooled_output's second pass, before the output projection: z of shape (B, 1, C) in the chunks' dtype."""
        dropout = self.training and self.attn_drop.p > 0
        total: torch.Tensor | None = None  # sum_j a_j, (B, H)
        abs_sum: torch.Tensor | None = None  # sum_j |logit_j|, (B, H): "floor" only
        tokens = 0
        kept_mass: torch.Tensor | None = None  # sum_j of the kept (dropped-out) a_j, with attention dropout
        pooled_x: torch.Tensor | None = None  # sum_j a_j x_j, (B, H, C)
        dtype = q_key.dtype
        for xc in chunks:
            dtype = xc.dtype
            xa = xc.to(q_key.dtype)
            logits = self._key_logits(xa, q_key, weights)  # (B, n, H)
            a = linear_scores(logits, self.linear_variant)
            if self.linear_variant == "floor":
                part_abs = logits.abs().sum(1)
                abs_sum = part_abs if abs_sum is None else abs_sum + part_abs
            tokens += xc.shape[1]
            kept = self.attn_drop(a) if dropout else a
            part_x = torch.bmm(kept.transpose(1, 2), xa)
            pooled_x = part_x if pooled_x is None else pooled_x + part_x
            total = a.sum(1) if total is None else total + a.sum(1)
            if dropout:
                kept_mass = kept.sum(1) if kept_mass is None else kept_mass + kept.sum(1)
        assert total is not None and pooled_x is not None, "no token chunks"
        mass = total if kept_mass is None else kept_mass
        z = torch.bmm(pooled_x.transpose(0, 1), weights.w_value.to(pooled_x.dtype)).transpose(0, 1)  # (B, H, D)
        b_value = weights.b_value
        if b_value is not None:
            z = torch.addcmul(z, mass[..., None], b_value.to(z.dtype))
        B, H, D = z.shape
        if self.record_dead:
            self.note_dead(total.detach() == 0)
        if self.linear_variant == "release":  # the release's exact expression (parity tests)
            normaliser = (total + self.eps) / weights.gamma.to(total.dtype)  # gamma on (B, H), not on W_v and b_v
        else:
            denominator = linear_normaliser(total, abs_sum, tokens, self.eps, self.linear_variant)
            normaliser = denominator / weights.gamma.to(total.dtype)
        return (z / normaliser[..., None]).to(dtype).reshape(B, 1, H * D)

    def _forward_folded(self, x: torch.Tensor) -> torch.Tensor:
        B, N, C = x.shape
        y = self.pooled_output(token_views(x)).expand(B, N, C)  # identical rows: projected once per sample
        return self.proj_drop(y) if self.training and self.proj_drop.p > 0 else y


# distill_gamma 0.5: the series then weighs its hops gamma / (1 - gamma) = 1 in all, softmax's scale (docs/results.md)
@register_mixer(
    "katz_infsa",
    option=Option("feature_map", FEATURE_MAPS, "relu"),
    cannot=("attn_drop", "attn_mask"),
    maps=INFSA_MAPS,
    causal=True,
    distill_gamma=0.5,
    aliases=("katz",),
)
@register_notrace_module
class KatzInfSAAttention(InfSABase):
    """Katz-InfSA: the exact infinite-hop series sum_t gamma^t A^^t v in O(N d^2) (linvit.ops.katz_infsa).

    Token-dependent outputs like pure InfSA, linear cost like Linear-InfSA. The attention matrix is
    never formed, so attention dropout and masks are not available. Without a scale norm, the output
    projection is folded into the d x D mixing (project_mixed): one (N, C) x (C, C) product replaces the
    per-head (N, d) x (d, D) products, the copy that merges heads, and the projection.
    """

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        *,
        feature_map: FeatureMap = "relu",
        feature_dim: int | None = None,
        **kwargs,
    ):
        if kwargs.get("attn_drop", 0.0):
            raise UsageError("Katz-InfSA never forms the attention matrix; attn_drop must be 0")
        super().__init__(dim, num_heads, **kwargs)
        self.use_feature_map(feature_map, feature_dim)

    def use_feature_map(self, feature_map: FeatureMap, feature_dim: int | None = None) -> None:
        """Select the feature map: a fixed one ("relu", "elu+1") or a learned one ("hedgehog": per-head maps of
        queries and keys, 2 feature_dim features, layers.feature_maps), built anew on the layer's device."""
        check_feature_map(feature_map, feature_dim)
        self.feature_map = feature_map
        self.kernel = "identity" if feature_map in LEARNED_FEATURE_MAPS else feature_map  # what the ops apply
        maps = query_and_key_maps(feature_map, self.num_heads, self.head_dim, feature_dim, self.qkv.weight)
        self.feature_q, self.feature_k = maps

    def featured_qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """project_qkv, with q and k through the learned feature maps where the layer has them (the ops then take
        them as the features: kernel "identity")."""
        q, k, v = self.project_qkv(x)
        return self.feature_q(q), self.feature_k(k), v

    def unmasked_qkv(
        self, x: torch.Tensor, attn_mask: torch.Tensor | None, is_causal: bool
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """featured_qkv for mix, which takes no mask; notes dead heads where the dead-head monitor records."""
        if attn_mask is not None or is_causal:
            raise ValueError("Katz-InfSA works on low-rank factors; attention masks are not supported")
        q, k, v = self.featured_qkv(x)
        if self.record_dead and self.feature_map == "relu":
            # ReLU features all zero on the query or the key side: A = 0 and the head adds nothing for that image
            self.note_dead((q.detach().flatten(2).amax(-1) <= 0) | (k.detach().flatten(2).amax(-1) <= 0))
        return q, k, v

    def mix(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None, is_causal: bool = False) -> torch.Tensor:
        q, k, v = self.unmasked_qkv(x, attn_mask, is_causal)
        if not isinstance(self.norm, nn.Identity):
            return self.merge_heads(katz_infsa(q, k, v, self.gamma, self.eps, feature_map=self.kernel))
        if not torch.jit.is_scripting():  # the factors and the folded projection with autocast off
            with no_autocast(v):
                return self.proj_drop(self._folded_output(q, k, v))
        return self.proj_drop(self._folded_output(q, k, v))

    def _folded_output(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """The output without a scale norm: the mixing X folded into the output projection (project_mixed)."""
        fq, mixing = katz_factors(q, k, v, self.gamma, self.eps, self.kernel)
        return self.project_mixed(q, mixing, fq)

    def project_mixed(self, q: torch.Tensor, mixing: torch.Tensor, fq: torch.Tensor | None = None) -> torch.Tensor:
        """proj(merge_heads(phi(q) @ mixing)) in q's dtype, as tokens (B, N, H*d) @ (X W_proj^T per head,
        stacked) + b (call with autocast off).

        X W_proj^T is (B, H, d, C): H*d*D*C multiply-adds per image, against N*C*D for fq @ X. The token
        features fq of the sums are used where they are token-major in q's dtype; otherwise (head-major, or
        upcast) they are taken from q again, token-major like q, which costs what one transposing copy would."""
        B, H, N, d = q.shape
        dtype = accumulation_dtype(q) if self.kernel == "elu+1" else q.dtype  # see ops.katz.feature_dtype
        if fq is None or fq.dtype != dtype or not merges_with_next(fq.transpose(1, 2), 2):
            fq = self.token_features(q)
        tokens = fq.transpose(1, 2).reshape(B, N, H * d)  # a view: fq is token-major
        weight = self.proj.weight.view(-1, H, mixing.shape[-1]).permute(1, 2, 0)  # (H, D, C_out)
        folded = mixing_as((mixing @ weight.to(mixing.dtype)).reshape(B, H * d, -1), dtype)  # (B, H*d, C_out)
        bias = self.proj.bias
        if bias is None:
            return torch.bmm(tokens, folded).to(q.dtype)
        return torch.baddbmm(bias.to(dtype), tokens, folded).to(q.dtype)

    def token_features(self, q: torch.Tensor) -> torch.Tensor:
        """phi(q) / c in q's dtype (ELU + 1's in the accumulation dtype) and layout (token-major for q from the
        qkv projection)."""
        if self.kernel == "relu":
            return torch.relu(q)  # exact in any dtype
        if self.kernel == "identity":
            return q  # a learned map's features already
        return katz_feature_map(q.to(accumulation_dtype(q)), self.kernel)  # ELU + 1: see ops.katz.feature_dtype

    def residual_streamed(self, x: torch.Tensor, spans: list[tuple[int, int]], norm, scale) -> torch.Tensor:
        """Pass 1 reads every span's tokens for the mixing X; in pass 2 each span reads only its own rows, so it
        is updated in place."""
        mixing = self.streamed_mixing(_Chunks(x, spans, norm))
        for s, e in spans:
            x[:, s:e] += scale(self.streamed_output(norm(x[:, s:e]), mixing))
        return x

    def streamed_mixing(self, chunks) -> torch.Tensor:
        """First pass of the token-streamed form: X (B, H, d, D) from token sums accumulated over the
        chunks, so that the layer's output for any tokens is streamed_output(x_tokens, X)."""
        sums = None
        for xc in chunks:
            q, k, v = self.featured_qkv(xc)
            v = self.streamed_values(v)
            with no_autocast(v):
                dtype = feature_dtype(q, self.kernel)
                (fq, c2), (fk, _) = katz_features(q, self.kernel, dtype), katz_features(k, self.kernel, dtype)
                part = katz_token_sums(fq, fk, v)
            sums = part if sums is None else tuple(a + b for a, b in zip(sums, part, strict=True))
        with no_autocast(sums[0]):
            return katz_mixing(sums, self.gamma, self.eps, c2)

    def streamed_values(self, v: torch.Tensor) -> torch.Tensor:
        """The values the first pass sums (a subclass may add columns: KatzRowsAttention's ones)."""
        return v

    def streamed_queries(self, x: torch.Tensor) -> torch.Tensor:
        """The featured queries (B, H, n, d) of the tokens x alone: the second pass projects nothing else."""
        B, n, C = x.shape
        bias = None if self.qkv.bias is None else self.qkv.bias[:C]
        q = self.q_norm(F.linear(x, self.qkv.weight[:C], bias).reshape(B, n, self.num_heads, -1).transpose(1, 2))
        return self.feature_q(q)

    def streamed_output(self, x: torch.Tensor, mixing: torch.Tensor) -> torch.Tensor:
        """Second pass: the layer's output (B, n, C) for the tokens x, given streamed_mixing of all tokens."""
        q = self.streamed_queries(x)
        with no_autocast(q):
            if isinstance(self.norm, nn.Identity):
                return self.project_mixed(q, mixing)
            fq = katz_features(q, self.kernel, feature_dtype(q, self.kernel))[0]
            out = fq @ mixing_as(mixing, fq.dtype)
        return self.merge_heads(out.to(q.dtype))


class _Chunks:
    """Re-iterable view of fn(x[:, s:e]) over token spans (the streaming passes iterate twice).

    fn runs under the autocast state the view was created in: a pass may iterate it inside ``no_autocast``,
    where a CUDA layer norm given a bfloat16 chunk and float32 weights fails (found at 4096 px on an H200)."""

    def __init__(self, x: torch.Tensor, spans: list[tuple[int, int]], fn) -> None:
        self.x, self.spans, self.fn = x, spans, fn
        self.autocast = autocast_dtype(x)

    def __iter__(self):
        return (self._apply(self.x[:, s:e]) for s, e in self.spans)

    def _apply(self, chunk: torch.Tensor) -> torch.Tensor:
        if self.autocast is None:
            return self.fn(chunk)
        with torch.autocast(chunk.device.type, dtype=self.autocast):
            return self.fn(chunk)
