"""Katz-InfSA with per-query normalised rows (`katz_rows`): every query's weights sum to 1, as softmax's do.

Katz-InfSA scales its operator by one Frobenius norm per head, so a query's total weight sum_j M_ij moves with
its features; distilled from a softmax teacher, that spread is what kept its students below plain linear
attention's (docs/results.md, "Why the Katz-InfSA students keep less"). This form divides each query's row of
the same infinite-hop series by its sum (ops.katz.katz_infsa_rows): the same parameters, the same O(N d^2) cost
plus one value column, the same feature maps (`katz_rows:hedgehog`). Its output projection is not folded into
the mixing (the division sits between them).
"""

import torch
from timm.layers import register_notrace_module

from ..mixers import Option, register_mixer
from ..ops.common import no_autocast
from ..ops.katz import divide_rows, feature_dtype, katz_features, katz_infsa_rows, mixing_as, with_ones
from .infsa_attention import FEATURE_MAPS, KatzInfSAAttention


@register_mixer(
    "katz_rows",
    option=Option("feature_map", FEATURE_MAPS, "relu"),
    cannot=("attn_drop", "attn_mask"),
    distill_gamma=0.5,  # no operator maps (explain): Katz's maps read A^, not the row-normalised series
)
@register_notrace_module
class KatzRowsAttention(KatzInfSAAttention):
    """Katz-InfSA whose every query's weights sum to 1 (ops.katz.katz_infsa_rows); bidirectional (no causal form)."""

    def mix(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None, is_causal: bool = False) -> torch.Tensor:
        q, k, v = self.unmasked_qkv(x, attn_mask, is_causal)
        return self.merge_heads(katz_infsa_rows(q, k, v, self.gamma, self.eps, feature_map=self.kernel))

    def streamed_values(self, v: torch.Tensor) -> torch.Tensor:
        return with_ones(v)

    def streamed_output(self, x: torch.Tensor, mixing: torch.Tensor) -> torch.Tensor:
        q = self.streamed_queries(x)
        with no_autocast(q):
            fq = katz_features(q, self.kernel, feature_dtype(q, self.kernel))[0]
            out = divide_rows(fq @ mixing_as(mixing, fq.dtype), self.eps)
        return self.merge_heads(out.to(q.dtype))


__all__ = ["KatzRowsAttention"]
