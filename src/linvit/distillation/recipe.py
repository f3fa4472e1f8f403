"""The recipe `linvit distill` picks when its flags leave it open: what the measurements of docs/results.md chose.

Causal language-model teachers with a stateful O(N) student form (causal Katz-InfSA, linear attention) get
the sliding-window hybrid at LM_WINDOW tokens and spend the whole run on attention transfer: on the GPT-2 of
docs/results.md (3 seeds, 10% of its steps), the end-to-end stage after transfer raised the windowed student's
loss gap (docs/distill.md, "Defaults"). Vision teachers keep both stages and have no window.
"""

from __future__ import annotations

from ..conversion.core import canonical_form

LM_WINDOW = 64  # LoLCATs' window, and the one measured (docs/results.md)
WINDOW_FORMS = ("katz_infsa", "linear_attention")  # the causal forms whose state a window can delay
AUTO = "auto"


def chosen_window(window: int | None, mixer: str, language: bool) -> int | None:
    """The student's window: the one asked for (0: none), or, left open (None), LM_WINDOW for a causal
    language model under a form that takes one and no window otherwise."""
    if window == 0:
        return None
    if window is not None:
        return window
    return LM_WINDOW if language and canonical_form(mixer).partition(":")[0] in WINDOW_FORMS else None


def chosen_stages(stages: str, window: int | None) -> str:
    """The stages: the ones asked for, or ("auto") attention transfer only for a windowed language student,
    both stages for every other."""
    if stages != AUTO:
        return stages
    return "attention" if window is not None else "both"
