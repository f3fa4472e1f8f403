"""No output is ever computed from stale weights, whichever public path changed them (issue 22, item 1).

Each case runs inference once (which would fill any cache of derived tensors), changes the weights through
one path, then compares inference (no autograd) with the autograd path and with a fresh model holding the
same weights. A cache keyed on parameter versions failed the ``.data`` case by 0.68 (max abs) before.
"""

from __future__ import annotations

import copy

import pytest
import timm
import torch
import torch.nn.utils.parametrize as parametrize
from timm.utils import ModelEmaV3

import linvit  # noqa: F401 - registers the families

FAMILIES = [
    "vit_4l_patch16_224",
    "infvit_tiny_patch16_224",
    "linear_infvit_tiny_patch16_224",
    "katz_infvit_tiny_patch16_224",
    "weightformer_tiny_patch16_224",
]


def _build(name: str) -> torch.nn.Module:
    kwargs = dict(num_classes=4, img_size=32, patch_size=8, depth=2, embed_dim=24)
    if name.startswith("weightformer"):
        kwargs.update(dynamic_blocks=[1])  # one static and one dynamic-weight block
    else:
        kwargs.update(num_heads=2)
    return timm.create_model(name, **kwargs).eval()


def _perturb(t: torch.Tensor) -> torch.Tensor:
    return t + 0.3 * torch.randn_like(t)


def _data_write(model):
    for p in model.parameters():
        p.data.copy_(_perturb(p.data))
    return model


def _load_state(model, assign=False):
    state = {k: _perturb(v) if v.is_floating_point() else v for k, v in model.state_dict().items()}
    model.load_state_dict(state, assign=assign)
    return model


def _optimizer_steps(model):
    opt = torch.optim.AdamW(model.parameters(), lr=0.05)
    for _ in range(2):
        model(torch.randn(2, 3, 48, 48)).square().mean().backward()
        opt.step()
        opt.zero_grad()
    return model.eval()


def _ema_update(model):
    ema = ModelEmaV3(model, decay=0.5)
    ema.module(torch.randn(1, 3, 48, 48))  # inference on the EMA copy first
    _data_write(model)
    ema.update(model)
    return ema.module.eval()


def _deepcopy(model):
    clone = copy.deepcopy(model)
    return _data_write(clone)


def _dtype_change(model):
    return _data_write(model.double())


class _Scaled(torch.nn.Module):
    def forward(self, w: torch.Tensor) -> torch.Tensor:
        return 1.5 * w


def _parametrize(model):
    for module in list(model.modules()):
        for name, p in list(module.named_parameters(recurse=False)):
            if p.dim() >= 2:
                parametrize.register_parametrization(module, name, _Scaled())
    return model


PATHS = {
    "data_write": _data_write,
    "load_state_dict": _load_state,
    "load_state_dict_assign": lambda m: _load_state(m, assign=True),
    "optimizer_steps": _optimizer_steps,
    "ema_update": _ema_update,
    "deepcopy": _deepcopy,
    "to_float64": _dtype_change,
    "parametrize": _parametrize,
}


@pytest.mark.parametrize("path", sorted(PATHS))
@pytest.mark.parametrize("name", FAMILIES)
def test_inference_sees_every_weight_change(name, path):
    torch.manual_seed(0)
    model = _build(name)
    x = torch.randn(2, 3, 48, 48)  # not the 32 px the model was built for: position tables are resampled
    with torch.no_grad():
        before = model(x)
    model = PATHS[path](model)
    x = x.to(next(model.parameters()).dtype)
    with torch.no_grad():
        inference = model(x)
    reference = model(x).detach()  # autograd on: everything derived afresh
    assert (inference - before.to(inference.dtype)).abs().max() > 1e-3, "the weight change did not reach the output"
    torch.testing.assert_close(inference, reference, rtol=1e-6, atol=1e-6)
    fresh = _build(name).to(inference.dtype)
    if path != "parametrize":
        fresh.load_state_dict(model.state_dict())
        with torch.no_grad():
            torch.testing.assert_close(fresh(x), inference, rtol=1e-6, atol=1e-6)
