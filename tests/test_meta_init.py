"""Meta-device construction (FSDP, accelerate, big-model loading) gives the original model back exactly.

A non-persistent buffer is in no checkpoint: after `to_empty` it holds whatever memory it got until the
module refills it (timm's protocol: `init_non_persistent_buffers`, called by `reinit_non_persistent_buffers`;
linvit's modules also refill on `load_state_dict`). Every family linvit registers with timm and every DiT mixer
is enrolled here automatically.
"""

from __future__ import annotations

import pytest
import timm
import torch
from timm.models import model_entrypoint
from timm.models._manipulate import reinit_non_persistent_buffers

import linvit  # noqa: F401  (registers the models)
from linvit.models.dit import create_dit, dit_mixers

REQUIRED_KWARGS = {"infsa_converted": dict(source_model="vit_tiny_patch16_224")}  # entrypoints with no default
REGISTERED = sorted(n for n in timm.list_models() if model_entrypoint(n).__module__.startswith("linvit"))
ENTRIES = [*REGISTERED, *(f"dit:{mixer}" for mixer in dit_mixers())]


def _build(entry: str, **extra) -> torch.nn.Module:
    """A tiny model of the entry (2 blocks, 32 px; DiT: 8 x 8 latents)."""
    if entry.startswith("dit:"):
        return create_dit("tiny", entry[4:], input_size=8, in_channels=3, num_classes=4, depth=2, **extra)
    kwargs = dict(num_classes=3, depth=2, img_size=32, **REQUIRED_KWARGS.get(entry, {}), **extra)
    return timm.create_model(entry, **kwargs)


def _outputs(model: torch.nn.Module, entry: str) -> torch.Tensor:
    torch.manual_seed(1)
    model.eval()
    with torch.no_grad():
        if entry.startswith("dit:"):
            return model(torch.randn(2, 3, 8, 8), torch.tensor([3, 500]), torch.tensor([0, 2]))
        return model(torch.randn(2, 3, 32, 32))


def _original(entry: str) -> torch.nn.Module:
    torch.manual_seed(0)
    return _build(entry).eval()


def _garbage_non_persistent_buffers(model: torch.nn.Module) -> list[str]:
    """NaN in every non-persistent buffer (what to_empty may leave, made certain); returns their names."""
    persistent = model.state_dict().keys()
    names = [name for name, _ in model.named_buffers() if name not in persistent]
    with torch.no_grad():
        for name in names:
            model.get_buffer(name).fill_(float("nan"))
    return names


def _assert_same(model: torch.nn.Module, original: torch.nn.Module, entry: str) -> None:
    buffers = dict(original.named_buffers())
    for name, buffer in model.named_buffers():
        assert torch.equal(buffer, buffers[name]), name
    torch.testing.assert_close(_outputs(model, entry), _outputs(original, entry), rtol=0, atol=0)


def test_every_registered_family_is_enrolled():
    assert {"weightformer_tiny_patch16_224", "infvit_tiny_patch16_224", "infsa_converted"} <= set(REGISTERED)
    assert "dit:weightformer" in ENTRIES


@pytest.mark.parametrize("entry", ENTRIES)
def test_meta_construction_then_load_state_dict_equals_the_original(entry):
    original = _original(entry)
    with torch.device("meta"):
        model = _build(entry)
    model.to_empty(device="cpu")
    _garbage_non_persistent_buffers(model)
    model.load_state_dict(original.state_dict())
    _assert_same(model, original, entry)


@pytest.mark.parametrize("entry", ENTRIES)
def test_timm_reinit_restores_every_non_persistent_buffer(entry):
    original = _original(entry)
    with torch.device("meta"):
        model = _build(entry)
    model.to_empty(device="cpu")
    names = _garbage_non_persistent_buffers(model)
    owners = {name.rpartition(".")[0] for name in names}
    reinitialized = {"" if n == "(root)" else n for n in reinit_non_persistent_buffers(model)}
    assert owners <= reinitialized  # every module owning one follows the protocol
    model.load_state_dict(original.state_dict())
    _assert_same(model, original, entry)


@pytest.mark.parametrize("entry", ENTRIES)
def test_load_state_dict_with_assign_onto_a_meta_model_equals_the_original(entry):
    original = _original(entry)
    with torch.device("meta"):
        model = _build(entry)
    model.load_state_dict(original.state_dict(), assign=True)  # parameters taken as they are, no to_empty
    _assert_same(model, original, entry)


@pytest.mark.parametrize("name", REGISTERED)
def test_timm_create_model_on_the_meta_device(name):
    original = _original(name)
    model = _build(name, device="meta")
    assert all(p.is_meta for p in model.parameters())
    model.to_empty(device="cpu")
    model.load_state_dict(original.state_dict())
    _assert_same(model, original, name)
