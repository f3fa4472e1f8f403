"""`run_evaluation(model, loader, metric)`: the one evaluation loop. A Metric says what a task measures (what
each batch adds, and the numbers at the end, reduced over ranks); the loop owns everything around it (eval
mode, no gradients, autocast, the progress bar), as fit() does for a Task. Classification, segmentation,
detection, generation and distillation (image and language teachers) evaluate through it, in training
(Task.evaluate) and in their eval commands alike.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Subset
from tqdm import tqdm

from ..data import collate_images
from ..utils.runtime import autocast


class Metric:
    """What one task's evaluation supplies to run_evaluation; it keeps its sums on its own device."""

    def update(self, forward: Callable, batch) -> None:
        """Add one batch of the loader; forward(*inputs, **options) is the model under the run's autocast.
        Moving the batch to the device is the metric's: only it knows the batch's layout."""
        raise NotImplementedError

    def result(self):
        """The numbers once every batch is in, reduced over ranks here, so every rank returns the same."""
        raise NotImplementedError


@torch.no_grad()
def run_evaluation(
    model: nn.Module,
    loader,
    metric: Metric,
    device: torch.device,
    amp: str = "none",
    progress: bool = False,
    desc: str = "eval",
):
    """metric.result() after every batch of the loader went through metric.update, the model in eval mode."""
    model.eval()

    def forward(*inputs, **options):
        with autocast(device, amp):
            return model(*inputs, **options)

    for batch in tqdm(loader, desc=desc, leave=False, disable=not progress):
        metric.update(forward, batch)
    return metric.result()


def eval_loader(dataset, batch_size: int, workers: int, rank: int, world: int, collate_fn=collate_images):
    """Disjoint rank shards (rank::world) in order; unequal shards are fine since results are summed."""
    shard = Subset(dataset, list(range(rank, len(dataset), world)))
    return DataLoader(shard, batch_size=batch_size, shuffle=False, num_workers=workers, collate_fn=collate_fn)
