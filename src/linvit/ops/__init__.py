"""Parameter-free tensor functions: the math of each token mixer, checked against float64 references."""

from .infsa import linear_infsa, linear_infsa_importance, pure_infsa, soft_query
from .katz import katz_centrality, katz_infsa, perron_vector

__all__ = [
    "pure_infsa", "linear_infsa", "linear_infsa_importance", "soft_query", "katz_infsa", "katz_centrality",
    "perron_vector",
]  # fmt: skip
