"""Training-health numbers of an epoch, kept on the device until the epoch's one host read: gradient norms
(mean, max, non-finite steps) and InfSA dead heads."""

from __future__ import annotations

import torch
import torch.nn as nn

DEAD_HEAD = 0.99  # a head counts as dead in an epoch when its scores are all zero for at least this share of images


class DeadHeadStats:
    """The InfSA layers' dead-head counts over one training epoch, kept on the device by the layers themselves.

    Every InfSA layer (an attribute ``record_dead``) adds, per head, the images whose scores were all zero
    (Linear-InfSA: importance; pure: the ReLU scores; Katz with ReLU features: either side's features) to a
    device tensor in its forward (layers.infsa_attention.InfSABase.note_dead); the epoch's single host sync
    reads them with the loss. metrics.jsonl gets ``dead_share`` (dead (image, head) pairs over all layers) and
    ``dead_heads`` (heads dead for >= DEAD_HEAD of the epoch's images); families without InfSA get neither.
    """

    def __init__(self, net: nn.Module):
        self.layers = [m for m in net.modules() if hasattr(m, "record_dead")]
        for layer in self.layers:
            device = layer.theta.device
            if layer.dead_counts is None or layer.dead_counts.device != device:
                layer.dead_counts = torch.zeros(layer.num_heads + 1, device=device)
            layer.dead_counts.zero_()  # in place: the tensor a compiled graph holds stays the same
            layer.record_dead = True

    def values(self, device: torch.device) -> torch.Tensor:
        """Per layer: its H dead counts then its image count, concatenated (empty without InfSA); recording off."""
        for layer in self.layers:
            layer.record_dead = False
        parts = [layer.dead_counts.to(device) for layer in self.layers]
        return torch.cat(parts) if parts else torch.zeros(0, device=device)

    def record(self, values: list[float]) -> dict:
        if not self.layers:
            return {}
        pairs = dead_pairs = dead_heads = 0.0
        offset = 0
        for layer in self.layers:  # a layer that records nothing (Katz with learned or ELU + 1 features) adds 0
            counts, images = values[offset : offset + layer.num_heads], values[offset + layer.num_heads]
            offset += layer.num_heads + 1
            pairs += images * layer.num_heads
            dead_pairs += sum(counts)
            dead_heads += sum(images > 0 and c >= DEAD_HEAD * images for c in counts)
        if not pairs:  # no layer can have all-zero scores: nothing to report (was "dead_share None")
            return {}
        return {"dead_share": dead_pairs / pairs, "dead_heads": int(dead_heads)}


class GradNormStats:
    """Per-step gradient norms summed on the device: mean and max over the finite ones, count of the others."""

    def __init__(self, device: torch.device):
        self.total = torch.zeros((), device=device)
        self.largest = torch.zeros((), device=device)
        self.finite = torch.zeros((), device=device)
        self.nonfinite = torch.zeros((), device=device)

    def add(self, norm: torch.Tensor) -> None:
        norm = norm.float()
        finite = torch.isfinite(norm)
        kept = torch.where(finite, norm, torch.zeros_like(norm))
        self.total += kept
        self.largest = torch.maximum(self.largest, kept)
        self.finite += finite
        self.nonfinite += ~finite

    def values(self) -> torch.Tensor:
        return torch.stack([self.total, self.largest, self.finite, self.nonfinite])

    @staticmethod
    def record(values: list[float]) -> dict:
        total, largest, finite, nonfinite = values
        return {
            "grad_norm": total / finite if finite else None,
            "grad_norm_max": largest if finite else None,
            "nonfinite_grad_steps": int(nonfinite),
        }
