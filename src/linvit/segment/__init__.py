"""Semantic segmentation on any linvit backbone: pyramid + semantic-FPN head, data, metrics, engine."""

from .metrics import confusion_matrix, scores
from .model import Segmenter, SemanticFPNHead, create_segmenter

__all__ = ["Segmenter", "SemanticFPNHead", "create_segmenter", "confusion_matrix", "scores"]
