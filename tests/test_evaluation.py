"""The one evaluation loop (linvit.engine.run_evaluation): a Metric of a few lines sees every batch through the
model in eval mode, without gradients, under the run's autocast, and what its result says is what the loop
returns. Each task's own numbers are held by its tests (test_train, test_segment, test_detect)."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from linvit.engine import Metric, eval_loader, run_evaluation


class Mean(Metric):
    """The mean model output; notes each batch's output dtype and whether it carries a gradient."""

    def __init__(self) -> None:
        self.seen, self.total, self.count = [], 0.0, 0

    def update(self, forward, batch) -> None:
        out = forward(batch)
        self.seen.append((out.dtype, out.requires_grad))
        self.total += out.float().sum().item()
        self.count += out.numel()

    def result(self) -> float:
        return self.total / self.count


def test_a_metric_of_your_own_sees_every_batch_in_eval_mode_without_gradients():
    model = nn.Sequential(nn.Linear(4, 1), nn.Dropout(0.9)).train()
    data = torch.randn(10, 4)
    loader = eval_loader(list(data), batch_size=4, workers=0, rank=0, world=1, collate_fn=torch.stack)
    metric = Mean()
    mean = run_evaluation(model, loader, metric, torch.device("cpu"))
    assert not model.training and len(metric.seen) == 3
    assert all(dtype == torch.float32 and not grad for dtype, grad in metric.seen)
    with torch.no_grad():
        assert mean == pytest.approx(model(data).mean().item())  # dropout off: the model ran in eval mode


def test_the_model_runs_under_the_runs_autocast():
    metric = Mean()
    run_evaluation(nn.Linear(4, 1), [torch.randn(2, 4)], metric, torch.device("cpu"), amp="bf16")
    assert metric.seen == [(torch.bfloat16, False)]


def test_eval_loader_gives_each_rank_a_disjoint_shard_in_order():
    shards = [
        [i for batch in eval_loader(list(range(7)), 2, 0, rank, 3, collate_fn=list) for i in batch] for rank in range(3)
    ]
    assert shards == [[0, 3, 6], [1, 4], [2, 5]]


def test_forward_takes_as_many_inputs_as_the_model():
    """The diffusion loss calls the model as model(noisy, t, labels): forward passes every input on."""

    class Add(nn.Module):
        def forward(self, a, b):
            return a + b

    class Pairs(Mean):
        def update(self, forward, batch) -> None:
            super().update(lambda pair: forward(*pair), batch)

    assert run_evaluation(Add(), [(torch.ones(2), torch.full((2,), 2.0))], Pairs(), torch.device("cpu")) == 3.0


def test_forward_passes_keyword_options_on():
    """Distillation's language metric calls model(input_ids=..., use_cache=False), a Hugging Face model's way."""

    class Scaled(nn.Module):
        def forward(self, input_ids, scale=1.0):
            return input_ids * scale

    class Keywords(Mean):
        def update(self, forward, batch) -> None:
            super().update(lambda ids: forward(input_ids=ids, scale=3.0), batch)

    assert run_evaluation(Scaled(), [torch.ones(2)], Keywords(), torch.device("cpu")) == 3.0
