"""The recipe `linvit distill` picks when its flags leave it open: what the measurements of docs/results.md chose.

The student's form ("auto"): image teachers get the anchor form, plain linear attention with learned (Hedgehog)
maps, which kept more of its teacher than Katz-InfSA with the same maps on every vision row (3 seeds, 10% of the
teachers' steps: 99.3 against 96.0% on `digit`, 100.1 against 92.4% on `max`, 96.6 against 86.7% on `digit` at
64 tokens); Katz-InfSA with per-query normalised rows (katz_rows) ties it on `digit` and `max` and stays 1.2
points below it at 64 tokens, so the anchor stays. Causal language models get Katz-InfSA with learned maps,
linvit's infinite-hop form, which ties the measured best, the anchor's LoLCATs form, with the window below at 128
and 512 tokens (1.76 against 1.75%, 1.57 against 1.60% loss gap). The pick does not depend on --strategy; a
resumed run keeps the recipe its folder stored (stored_recipe).

Causal language-model teachers with a stateful O(N) student form (causal Katz-InfSA, linear attention) get
the sliding-window hybrid at LM_WINDOW tokens and spend the whole run on attention transfer: on the GPT-2 of
docs/results.md (3 seeds, 10% of its steps), the end-to-end stage after transfer raised the windowed student's
loss gap (docs/distill.md, "Defaults"). Vision teachers keep both stages and have no window.
"""

from __future__ import annotations

from pathlib import Path

from ..conversion.core import canonical_form

IMAGE_MIXER = "linear_attention:hedgehog"
LANGUAGE_MIXER = "katz_infsa:hedgehog"
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


def chosen_mixer(mixer: str, language: bool) -> str:
    """The student's form: the one asked for, or ("auto") the one measured for the teacher's kind (module
    docstring)."""
    if mixer != AUTO:
        return mixer
    return LANGUAGE_MIXER if language else IMAGE_MIXER


def stored_recipe(output: str | None, resume: str | None) -> dict:
    """The recipe a run folder being resumed stored (its own args.yaml, or its attention stage's): mixer,
    gamma_init, stages, window, so that flags left open resume what the run started with, whatever today's
    picks or --strategy; {} for a new run."""
    if not resume or not output:
        return {}
    import yaml

    for folder in (Path(output), Path(output) / "attention"):
        args = folder / "args.yaml"
        if args.is_file():
            stored = yaml.safe_load(args.read_text()) or {}
            if stored.get("mixer") not in (None, AUTO):
                return {k: stored.get(k) for k in ("mixer", "gamma_init", "stages", "window")}
    return {}
