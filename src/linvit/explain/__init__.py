"""Interpretability and spectral tools: importance maps, MoRF/LeRF, box AUCs, pointing game, spectra, ERF."""

from .erf import effective_receptive_field
from .maps import METHODS, ImportanceMaps, default_method, importance_maps
from .metrics import area_over_curve, box_auc, box_mask, perturbation_curves, pointing_game
from .spectral import spectral_report

__all__ = [
    "importance_maps",
    "ImportanceMaps",
    "METHODS",
    "default_method",
    "perturbation_curves",
    "area_over_curve",
    "box_auc",
    "box_mask",
    "pointing_game",
    "spectral_report",
    "effective_receptive_field",
]
