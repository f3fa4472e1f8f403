"""Every family compiles as one graph, matches eager, and keeps its graph free of host work (CUDA-graph ready)."""

from __future__ import annotations

import pytest
import timm
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

import linvit  # noqa: F401
from linvit.bench.opcount import count_ops

aten = torch.ops.aten

SMALL = dict(depth=2, embed_dim=64, num_heads=2, num_classes=10)
FAMILIES = {
    "vit_4l_patch16_224": SMALL,
    "infvit_tiny_patch16_224": SMALL,
    "linear_infvit_tiny_patch16_224": SMALL,
    "katz_infvit_tiny_patch16_224": SMALL,
    "weightformer_tiny_patch16_224": dict(depth=4, embed_dim=64, num_classes=10),  # block 1 is dynamic
}
# ops that read a device value on the host (a synchronisation, and a graph break in torch.compile)
HOST_SYNC = {aten._local_scalar_dense, aten.item, aten.nonzero, aten._linalg_check_errors, aten.is_nonzero, aten.equal}


def _model(name: str) -> torch.nn.Module:
    torch.manual_seed(0)
    return timm.create_model(name, **FAMILIES[name]).eval()


class _DeviceAudit(TorchDispatchMode):
    """Records host syncs and any tensor that is not on `device` (what CUDA graphs cannot capture)."""

    def __init__(self, device: str) -> None:
        super().__init__()
        self.device, self.problems = device, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket in HOST_SYNC:
            self.problems.append(f"host sync: {func}")
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten((args, kwargs, out))[0]:
            if isinstance(t, torch.Tensor) and t.device.type != self.device:
                self.problems.append(f"{func} touches a {t.device} tensor of shape {tuple(t.shape)}")
        return out


@pytest.mark.parametrize("name", FAMILIES)
def test_one_graph_without_breaks_in_inference_and_training(name):
    model = _model(name)
    x = torch.randn(2, 3, 64, 96)
    with torch.no_grad():
        explained = torch._dynamo.explain(model)(x)
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained.break_reasons
    model.train()
    explained = torch._dynamo.explain(lambda t: model(t).sum())(x)
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained.break_reasons


@pytest.mark.parametrize("name", FAMILIES)
def test_no_host_sync_and_no_foreign_device_tensor(name):
    """On the meta device every tensor the forward (and backward) creates must follow the input's device."""
    model = _model(name).to("meta")
    x = torch.empty(2, 3, 64, 96, device="meta")
    with _DeviceAudit("meta") as audit, torch.no_grad():
        model(x)
    assert audit.problems == []
    model.train()
    with _DeviceAudit("meta") as audit:
        model(x).sum().backward()
    assert audit.problems == []


def test_audit_catches_a_host_sync_and_a_cpu_tensor():
    x = torch.empty(3, device="meta")
    with _DeviceAudit("meta") as audit:
        torch.linalg.solve(torch.eye(3, device="meta"), x)  # checks errors on the host
        x + torch.ones(3)[0]  # a CPU scalar tensor mixed in
    assert any("host sync" in p for p in audit.problems) and any("cpu tensor" in p for p in audit.problems)


@pytest.mark.parametrize("name", FAMILIES)
def test_inductor_matches_eager_without_recompiling(name):
    model = _model(name)
    x = torch.randn(2, 3, 64, 96)
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, dynamic=False)
    with torch.no_grad():
        eager = model(x)
        first = compiled(x)
        with torch._dynamo.config.patch(error_on_recompile=True):
            second = compiled(torch.randn(2, 3, 64, 96))
    torch.testing.assert_close(first, eager, rtol=1e-4, atol=1e-5)
    assert second.shape == eager.shape


# Non-view ATen operators per inference forward (torch.no_grad, fp32, CPU, batch 1), counted by
# linvit.bench.opcount; the table in docs/benchmarks.md shows where each mixer spends its launches.
# "before" is the count of the commit before the lean path; budgets may only go down, except that since issue 22
# nothing derived from parameters is cached (a stale cache is worse than a launch): +2 per resampled position
# table, +3 per Linear-InfSA layer, +1 per WeightFormer block.
OP_BUDGETS = {  # name: (side, before, budget)
    "vit_4l_patch16_224": (1024, 47, 47),
    "infvit_4l_patch16_224": (224, 97, 85),
    "linear_infvit_4l_patch16_224": (1024, 143, 115),
    "katz_infvit_4l_patch16_224": (1024, 139, 123),
    "weightformer_tiny_patch16_224": (1248, 268, 226),
}


@pytest.mark.parametrize("name", OP_BUDGETS)
def test_op_count_budget(name):
    side, before, budget = OP_BUDGETS[name]
    model = timm.create_model(name).eval()
    x = torch.randn(1, 3, side, side)
    with torch.no_grad():
        model(x)  # warm-up
        ops = count_ops(lambda: model(x))
    assert budget <= before
    assert ops.total <= budget, ops.ops.most_common(10)
