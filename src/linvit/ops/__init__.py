"""Parameter-free tensor functions: the math of each token mixer, checked against float64 references.

Each formula is defined once here: the mixers (pure_infsa, linear_infsa, katz_infsa and its causal forms, the
causal sliding-window hybrid), the operators they apply (infsa_operator, katz_operator), the Katz kernel, the
soft query and the Perron vectors. The layers, and the interpretability and spectral tools, call these.
"""

from .infsa import infsa_operator, linear_infsa, linear_infsa_importance, pure_infsa, soft_query
from .katz import (
    katz_centrality,
    katz_infsa,
    katz_infsa_rows,
    katz_kernel,
    katz_operator,
    perron_vector,
    perron_vector_dense,
)
from .katz_causal import causal_katz_chunked, causal_katz_dense, causal_katz_recurrent
from .window_causal import WindowState, window_causal_chunked, window_causal_recurrent

__all__ = [
    "pure_infsa",
    "linear_infsa",
    "linear_infsa_importance",
    "soft_query",
    "infsa_operator",
    "katz_infsa",
    "katz_infsa_rows",
    "causal_katz_chunked",
    "causal_katz_recurrent",
    "causal_katz_dense",
    "window_causal_chunked",
    "window_causal_recurrent",
    "WindowState",
    "katz_operator",
    "katz_kernel",
    "katz_centrality",
    "perron_vector",
    "perron_vector_dense",
]
