"""Pure InfSA and Linear-InfSA as functions of projected q, k, v (docs/spec/infsa.md 2-3, arXiv:2603.00175).

Both match the reference release (github.com/giorgioroffo/infinite-self-attention, infsa/core.py)
operation for operation; gamma may be a float or a per-head tensor of shape (H,).
"""

from __future__ import annotations

import math
from typing import Literal, get_args

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from ..errors import UsageError
from .common import (
    GammaLike,
    accumulation_dtype,
    check_qkv,
    eager_autocast_off,
    elu_plus_one,
    float32_matmul,
    gamma_as_tensor,
    is_exporting,
    no_autocast,
)

# Dense pure InfSA materialises H*N*N scores per sample; above this many "auto" switches to the two-pass form,
# which holds at most half as many per sample at once (H*block*N) unless block_size is given. The choice is per
# sample, so an image gets the same form (and FLOPs) at any batch size.
DENSE_MAX_SCORES = 2**25


def _scaled(t: torch.Tensor) -> torch.Tensor:
    """q / sqrt(d) (and k / sqrt(d)): the reference scales both sides, so logits are q k^T / d."""
    return t * math.sqrt(1.0 / t.shape[-1])


def _relu_scores(q_blk: torch.Tensor, k: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """ReLU(q k^T / d) for a block of queries, with masked-out pairs set to zero."""
    scores = torch.relu_(_scaled(q_blk) @ _scaled(k).transpose(-2, -1))  # in place: one N x N tensor
    if mask is not None:
        scores = scores.masked_fill(~mask, 0.0)
    return scores


def infsa_operator(
    q: torch.Tensor, k: torch.Tensor, eps: float = 1e-6, attn_mask: torch.Tensor | None = None
) -> torch.Tensor:
    """The dense InfSA operator A^ = ReLU(q k^T / d) / (||ReLU(q k^T / d)||_F + eps), shape (B, H, N, N).

    The Frobenius norm is per (batch, head) and accumulates in float32 for half inputs. With attn_mask
    (False = removed), masked pairs are removed and each query row is normalised over the graph it can
    see (masked_row_norms), so a causal or padding mask hides the removed tokens completely. Pure InfSA's
    dense form applies exactly this matrix, and the interpretability and spectral tools read it.
    """
    mask = _check_mask(attn_mask, q)
    scores = _relu_scores(q, k, mask)
    acc = accumulation_dtype(scores)
    if mask is None:
        norm = torch.linalg.vector_norm(scores, dim=(-2, -1), keepdim=True, dtype=acc)
    else:
        norm = masked_row_norms(row_square_sums(scores), mask)[..., None]
    return (scores / (norm + eps)).to(scores.dtype)  # divided in float32: float16 cannot hold every norm


def infsa_column_sums(q: torch.Tensor, k: torch.Tensor, eps: float = 1e-6, block_size: int = 1024) -> torch.Tensor:
    """Column sums of infsa_operator, sum_i A^_ij (how much each token is attended), shape (B, H, N).

    Query blocks of ``block_size`` rows at a time, so memory is B*H*block*N scores, never N x N: the
    one-hop map works at every size the model runs at (O(N^2) time, as pure InfSA itself).
    """
    acc = accumulation_dtype(q)
    columns = torch.zeros(k.shape[:-1], dtype=acc, device=k.device)
    squares = torch.zeros(k.shape[:2], dtype=acc, device=k.device)
    for s in range(0, q.shape[2], block_size):
        scores = _relu_scores(q[:, :, s : s + block_size], k, None)
        columns += scores.sum(-2, dtype=acc)
        squares += row_square_sums(scores).sum(-1)
    return columns / (squares.sqrt() + eps)[..., None]


def row_square_sums(scores: torch.Tensor) -> torch.Tensor:
    """Sum of squared scores of every query row, (B, H, n), in the accumulation dtype."""
    return torch.linalg.vector_norm(scores, dim=-1, dtype=accumulation_dtype(scores)).square()


@eager_autocast_off  # autocast would run the sums of squares in half precision
def masked_row_norms(row_sq: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-query Frobenius norm under a mask: query i is normalised over the rows of the queries it sees.

    norm_i = sqrt(sum_r mask[i, r] ||A+_r||^2) for row_sq = ||A+_r||^2 of shape (B, H, N) and mask rows
    (B, H, n, N). Without a mask (all True) this is the global norm; with a causal mask it is the norm of
    the prefix graph, and with a padding mask that of the valid tokens, so the removed tokens never reach
    the kept ones, not even through the normalisation (linvit's reading, docs/spec/infsa.md section 2). A
    mask shared by every head or sample (size 1 or stride 0 there) is read once, never copied per head.
    """
    B, H, N = row_sq.shape
    if mask.shape[1] == 1 or mask.stride(1) == 0:  # one mask for every head (causal, padding): no copy per head
        shared = mask[:, 0]
        if shared.shape[0] == 1 or shared.stride(0) == 0:  # and for every sample: one (n, N) x (N, B*H) product
            squares = (shared[0].to(row_sq.dtype) @ row_sq.reshape(B * H, N).transpose(0, 1)).transpose(0, 1)
            squares = squares.reshape(B, H, -1)
        else:
            squares = (shared.to(row_sq.dtype) @ row_sq.transpose(1, 2)).transpose(1, 2)
    else:
        squares = (mask.to(row_sq.dtype) @ row_sq[..., None]).squeeze(-1)
    # a query that sees only all-zero rows (every logit <= 0) has norm 0, where sqrt's gradient is infinite
    # and would make the whole backward NaN; squares below 1e-30 (norms below 1e-15, far under the eps that is
    # added to them) are clamped instead. A constant: TorchScript has no torch.finfo.
    return squares.clamp_min(1e-30).sqrt()


def _check_mask(attn_mask: torch.Tensor | None, q: torch.Tensor) -> torch.Tensor | None:
    if attn_mask is None:
        return None
    B, H, N, _ = q.shape
    if not torch.jit.is_scripting():
        _explain_bad_mask(attn_mask, (B, H, N, N))
    return torch.broadcast_to(attn_mask, (B, H, N, N))


def _explain_bad_mask(attn_mask: torch.Tensor, shape: tuple[int, int, int, int]) -> None:
    """A one-line ValueError for a mask InfSA cannot use (eager only: TorchScript parses no try blocks)."""
    if attn_mask.dtype != torch.bool:
        raise ValueError("InfSA supports boolean attention masks only (True = keep); got dtype " + str(attn_mask.dtype))
    try:
        torch.broadcast_shapes(attn_mask.shape, shape)
    except RuntimeError as err:
        raise ValueError(f"attn_mask of shape {tuple(attn_mask.shape)} does not broadcast to {shape}") from err


def pure_infsa(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    gamma: GammaLike,
    eps: float = 1e-6,
    impl: str = "auto",
    block_size: int | None = None,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    max_dense_scores: int = DENSE_MAX_SCORES,
) -> torch.Tensor:
    """One hop of pure InfSA: gamma * ReLU(q k^T / d) / (||ReLU(q k^T / d)||_F + eps) @ v.

    The Frobenius norm is taken per (batch, head) over the whole N x N matrix. ``impl="chunked"``
    makes two passes over query blocks (norm first, output second) so at most B*H*block*N scores
    exist at once; with gradients enabled each block is recomputed in backward (checkpointing), so
    training memory stays bounded too. ``"auto"`` picks the chunked form when one sample's H*N*N scores
    exceed ``max_dense_scores`` (per sample, so the batch size never changes the form). Graphs captured by
    torch.export (pt2, ONNX) take the dense form whatever ``impl`` says: their N is symbolic.

    Args:
        q, k, v: (B, H, N, D) tensors.
        gamma: discount in (0, 1): a float or a per-head tensor of shape (H,).
        eps: added to the Frobenius norm; all-non-positive logits give a zero output, not NaN.
        impl: "dense", "chunked" or "auto".
        block_size: query rows per block for the chunked form (default: max_dense_scores / 2 scores a block
            per sample).
        attn_mask: optional boolean mask broadcastable to (B, H, N, N); False entries are removed
            from the graph, and each query is normalised over the rows of the queries it sees
            (masked_row_norms), so outputs never depend on tokens the mask hides.
        dropout_p: dropout on the normalised scores (pass 0 at inference), as the release does.
        max_dense_scores: the most B*H*N*N scores "auto" materialises (module default DENSE_MAX_SCORES;
            an argument, not a global read, so scripted graphs carry it).

    Returns:
        (B, H, N, D) tensor in v's dtype.
    """
    check_qkv(q, k, v)
    _, H, N, _ = q.shape
    g = gamma_as_tensor(gamma, H, v)
    mask = _check_mask(attn_mask, q)
    if is_exporting() and impl != "dense":  # an exported graph takes any N, so it has one form: the chunked
        impl = "dense"  # form's loop and "auto"'s choice would guard on N
    if impl == "auto":
        impl = "chunked" if H * N * N > max_dense_scores else "dense"
    if impl == "dense":
        return _pure_infsa_dense(q, k, v, g, eps, mask, dropout_p)
    if impl != "chunked":
        raise ValueError(f"impl must be 'auto', 'dense' or 'chunked', got '{impl}'")
    block = block_size if block_size is not None else max(1, max_dense_scores // 2 // max(1, H * N))
    if block < 1:
        raise ValueError(f"block_size must be >= 1, got {block}")
    return _pure_infsa_chunked(q, k, v, g, eps, block, mask, dropout_p)


def _pure_infsa_dense(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    eps: float,
    mask: torch.Tensor | None,
    dropout_p: float,
) -> torch.Tensor:
    """(ReLU(q k^T / d) @ v) * gamma / norm: the scale acts on the (N, D) product, so the only N x N tensor
    is the scores themselves (the normalised operator is infsa_operator, for the tools that read it)."""
    scores = _relu_scores(q, k, mask)
    if mask is None:
        norm = torch.linalg.vector_norm(scores, dim=(-2, -1), keepdim=True, dtype=accumulation_dtype(scores))
    else:
        norm = masked_row_norms(row_square_sums(scores), mask)[..., None]  # one norm per query row
    scale = g.to(norm.dtype) / (norm + eps)
    return scaled_product(F.dropout(scores, dropout_p, training=dropout_p > 0), v, scale)


def scaled_product(scores: torch.Tensor, v: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """(scores @ v) * scale in v's dtype, for a scale of shape (B, H, n or 1, 1) in the accumulation dtype.

    Half scores are summed over the N keys in float32 (float32_matmul) and scaled there, rounded once at the
    end: float16's range (65504) holds neither gamma / (norm + eps) of a head whose scores are all zero (~1e6,
    and 0 * inf = NaN) nor the unnormalised sums over ~2k tokens, and bfloat16 rounded the sum, the scale and
    their product (2.3x float32's error in a converted LM).
    """
    if scores.dtype == torch.float16 or scores.dtype == torch.bfloat16:  # TorchScript reads no module tuples
        if not torch.jit.is_scripting():
            with no_autocast(v):
                out = float32_matmul(scores, v.to(scores.dtype))
        else:
            out = scores.float() @ v.float()
        return (out * scale.float()).to(v.dtype)
    return (scores @ v) * scale.to(v.dtype)


def _pure_infsa_chunked(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    eps: float,
    block_size: int,
    mask: torch.Tensor | None,
    dropout_p: float,
) -> torch.Tensor:
    """Two passes over query blocks: every row's squared norm first, then each block's output with its scale."""
    N = q.shape[2]
    spans: list[tuple[int, int]] = []
    for s in range(0, N, block_size):
        spans.append((s, min(s + block_size, N)))
    # with autograd recording, each block is recomputed in backward (checkpointing), so no block's scores are kept
    recompute = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad or g.requires_grad)
    row_sq_parts: list[torch.Tensor] = []
    for s, e in spans:
        row_sq_parts.append(_query_block(q[:, :, s:e], k, None, None, _mask_rows(mask, s, e), 0.0, recompute))
    row_sq = torch.cat(row_sq_parts, -1)
    g = g.to(accumulation_dtype(v))
    global_scale = g / (row_sq.sum(-1).sqrt()[..., None, None] + eps)  # gamma / (||A+||_F + eps), (B, H, 1, 1)
    outs: list[torch.Tensor] = []
    for s, e in spans:
        m = _mask_rows(mask, s, e)  # under a mask: one norm per query row, (B, H, n, 1)
        scale = global_scale if m is None else g / (masked_row_norms(row_sq, m)[..., None] + eps)
        outs.append(_query_block(q[:, :, s:e], k, v, scale, m, dropout_p, recompute))
    return torch.cat(outs, dim=2)


def _mask_rows(mask: torch.Tensor | None, start: int, end: int) -> torch.Tensor | None:
    return None if mask is None else mask[:, :, start:end]


def _query_block(
    q_blk: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor | None,
    scale: torch.Tensor | None,
    mask: torch.Tensor | None,
    dropout_p: float,
    recompute: bool,
) -> torch.Tensor:
    """One query block of the two passes: its score rows' squared norms (pass 1: v and scale None), or its
    output, the normalised scores applied to v (pass 2). With ``recompute`` the scores are rebuilt in backward
    (checkpointing), so no block's scores are kept for it."""
    if recompute and not torch.jit.is_scripting():
        return checkpoint(_query_block, q_blk, k, v, scale, mask, dropout_p, False, use_reentrant=False)
    scores = _relu_scores(q_blk, k, mask)
    if v is None or scale is None:
        return row_square_sums(scores)
    return scaled_product(F.dropout(scores, dropout_p, training=dropout_p > 0), v, scale)


@eager_autocast_off  # autocast would run the product in bfloat16 (scripted graphs have no autocast)
def soft_query_sums(q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The two token sums behind the soft query, for token-major raw queries q of shape (B, N, H, D).

    Returns num = sum_i ||q_i|| q_i of shape (B, H, D) and den = sum_i ||q_i|| of shape (B, H), accumulated
    and returned in the accumulation dtype (float32 for half inputs: a bfloat16 product output would round
    each sum over N tokens to 8 bits, a relative error of ~2e-3). The weighted sum is one (B, H, N) x
    (B, N, H*D) product whose head-diagonal blocks are kept: H times the (tiny) FLOPs of a per-head sum, but
    no permuted copy of Q.
    """
    B, N, H, D = q.shape
    q = q.to(accumulation_dtype(q))  # half inputs: accumulate and return float32 (CPU matmuls have no out_dtype)
    energy = torch.linalg.vector_norm(q, dim=-1)  # (B, N, H)
    den = energy.sum(1)
    every_head = torch.bmm(energy.transpose(1, 2), q.reshape(B, N, H * D))  # (B, H, H*D)
    num = every_head.view(B, H, H, D).diagonal(dim1=1, dim2=2).transpose(1, 2)  # (B, H, D)
    return num, den


def soft_query_from_sums(num: torch.Tensor, den: torch.Tensor, eps: float = 1e-6, scale: float = 1.0) -> torch.Tensor:
    """q_bar / scale from soft_query_sums: q_bar = sum_i e_i q~_i / (sum_i e_i + eps), q~ = q / sqrt(D), e_i = ||q~_i||.

    The 1/sqrt(D) scales act on the (B, H) and (B, H, D) sums, not on Q: q_bar = num / (sqrt(D) (den + eps sqrt(D))).
    """
    root_d = math.sqrt(num.shape[-1])
    denom = den + eps * root_d
    if root_d * scale != 1.0:
        denom = denom * (root_d * scale)
    return num / denom[..., None]


def soft_query(q: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Energy-weighted mean of the scaled queries: q_bar = sum_i (e_i / (sum_t e_t + eps)) q~_i, e_i = ||q~_i||.

    Args:
        q: (B, H, N, D) raw queries (scaled by 1/sqrt(D) as in the release; the ReLU the release applies
            to the non-negative energies is a no-op).

    Returns:
        (B, H, D) soft query in the accumulation dtype (float32 for half inputs).
    """
    return soft_query_from_sums(*soft_query_sums(q.transpose(1, 2)), eps)


def l1_normalize(a: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """a / (sum_j a_j + eps) over the last (token) dimension."""
    return a / (a.sum(dim=-1, keepdim=True) + eps)


# Linear-InfSA's score maps (docs/spec/infsa.md section 3.1): "release" is the paper's ReLU with an absolute eps;
# the others are linvit's opt-in stabilised forms, each O(N) and sharing the folded layer's token sums.
LinearVariant = Literal["release", "floor", "softplus", "elu+1"]  # typed options: the matrix enumerates them
LINEAR_VARIANTS = get_args(LinearVariant)
FLOOR_TAU = 1.0  # "floor": the normaliser is at least FLOOR_TAU * mean_l |logit_l| (the logits' own scale)


def check_linear_variant(variant: str) -> None:
    """A one-line error for an unknown variant (eager only: TorchScript reads no module-level tuples)."""
    if not torch.jit.is_scripting():
        if variant not in LINEAR_VARIANTS:
            raise UsageError(f"linear_variant must be one of {', '.join(LINEAR_VARIANTS)}; got {repr(variant)}")


def linear_scores(logits: torch.Tensor, variant: str) -> torch.Tensor:
    """r_j from the logits q_bar . k~_j: ReLU ("release", "floor"), softplus, or ELU + 1 (no dead zone)."""
    if variant == "softplus":
        return F.softplus(logits)
    if variant == "elu+1":
        return elu_plus_one(logits)
    return torch.relu(logits)


def linear_normaliser(
    total: torch.Tensor, abs_sum: torch.Tensor | None, tokens: int, eps: float, variant: str
) -> torch.Tensor:
    """The importance's denominator from the token sums total = sum_l r_l and abs_sum = sum_l |logit_l|.

    "floor" adds FLOOR_TAU * mean_l |logit_l|: a head that lets one token barely through the ReLU then has a
    normaliser of the logits' scale, not ~eps, so d a / d logit stays of order 1 / |logit| (no spike).
    "softplus" and "elu+1" have r_l > 0, so no eps: the importance sums to 1 even where every logit is very
    negative (there both maps are exp, and a is the softmax of the logits); the clamp at 1e-30 only
    guards sums that underflow (logits below ~-100).
    """
    if variant == "floor":
        assert abs_sum is not None, "floor needs sum_l |logit_l|"
        return total + abs_sum * (1.0 / tokens) + eps  # FLOOR_TAU = 1 (a literal: TorchScript reads no globals)
    if variant == "softplus" or variant == "elu+1":
        return total.clamp_min(1e-30)
    return total + eps


def linear_infsa_importance(
    q: torch.Tensor, k: torch.Tensor, eps: float = 1e-6, variant: str = "release"
) -> torch.Tensor:
    """Linear-InfSA's token importance a_j = r_j / (sum_l r_l + eps), r_j = ReLU(q_bar . k~_j) as released.

    One step of power iteration toward the left Perron vector of A^ (how strongly each token is
    attended); ``variant`` picks a stabilised score map (LINEAR_VARIANTS). Returns (B, H, N) in the
    accumulation dtype, computed with autocast off.
    """
    check_linear_variant(variant)
    return _importance(q, k, eps, variant)


@eager_autocast_off
def _importance(q: torch.Tensor, k: torch.Tensor, eps: float, variant: str = "release") -> torch.Tensor:
    q_bar = soft_query(q, eps)
    return importance_from_logits(torch.einsum("bhd,bhnd->bhn", q_bar, _scaled(k.to(q_bar.dtype))), eps, variant)


def importance_from_logits(logits: torch.Tensor, eps: float, variant: str) -> torch.Tensor:
    """The importance a over the last (token) axis of the logits q_bar . k~_j, in the variant's form."""
    if variant == "release":  # the release's exact expression (parity tests)
        return l1_normalize(torch.relu(logits), eps)
    r = linear_scores(logits, variant)
    abs_sum = logits.abs().sum(-1, keepdim=True) if variant == "floor" else None
    return r / linear_normaliser(r.sum(-1, keepdim=True), abs_sum, logits.shape[-1], eps, variant)


def linear_infsa(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    gamma: GammaLike,
    eps: float = 1e-6,
    dropout_p: float = 0.0,
    variant: str = "release",
) -> torch.Tensor:
    """Linear-InfSA: every token receives z = gamma * sum_j a_j v_j, with a the importance vector.

    O(N D) per head. Token sums run in float32 under autocast (they span up to ~10^6 tokens).
    dropout_p drops entries of the importance vector, as the release drops its scores. ``variant``: the score
    map and normaliser (LINEAR_VARIANTS; "release" is the paper's).

    Returns:
        (B, H, N, D) tensor in v's dtype; all N rows are equal (the release broadcasts the pooled value).
    """
    check_qkv(q, k, v)
    check_linear_variant(variant)
    return _linear_infsa(q, k, v, gamma, eps, dropout_p, variant)


@eager_autocast_off
def _linear_infsa(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    gamma: GammaLike,
    eps: float,
    dropout_p: float,
    variant: str = "release",
) -> torch.Tensor:
    a = F.dropout(_importance(q, k, eps, variant), dropout_p, training=dropout_p > 0)
    g = gamma_as_tensor(gamma, q.shape[1], a)[..., 0]  # (1, H, 1)
    z = torch.einsum("bhn,bhnd->bhd", g * a, v.to(a.dtype))
    return z.to(v.dtype).unsqueeze(2).expand(v.shape)
