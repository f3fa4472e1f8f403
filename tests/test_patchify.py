"""The patch embedding's convolution as one matrix product under CPU bf16 autocast (models._patchify)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from timm.layers import PatchEmbed

from linvit.models._input import CheckedPatchEmbed
from linvit.models._patchify import PatchifyConv2d


def _conv(**kwargs) -> PatchifyConv2d:
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(3, 8, **kwargs)
    conv.__class__ = PatchifyConv2d
    return conv


@pytest.mark.parametrize("patch", [(4, 4), (2, 4)])
def test_bf16_autocast_product_equals_the_float64_convolution_of_the_bf16_operands(patch):
    conv = _conv(kernel_size=patch, stride=patch)
    x = torch.randn(2, 3, 8, 16)
    calls = []
    real = F.linear
    with torch.autocast("cpu", dtype=torch.bfloat16), torch.no_grad():
        F.linear = lambda *a: calls.append(1) or real(*a)
        try:
            got = conv(x)
        finally:
            F.linear = real
    assert calls == [1] and got.dtype == torch.bfloat16 and got.shape == (2, 8, 8 // patch[0], 16 // patch[1])
    b16 = [t.bfloat16().double() for t in (x, conv.weight, conv.bias)]
    want = F.conv2d(*b16, stride=patch)
    assert (got.double() - want).abs().max() <= 2**-8 * want.abs().max()  # bf16 output rounding, not more


def test_float32_and_overlapping_or_ragged_inputs_keep_the_convolution():
    conv = _conv(kernel_size=4, stride=4)
    x = torch.randn(1, 3, 8, 8)
    with torch.no_grad():
        assert torch.equal(conv(x), F.conv2d(x, conv.weight, conv.bias, stride=4))  # no autocast: bit for bit
        with torch.autocast("cpu", dtype=torch.bfloat16):
            ragged = torch.randn(1, 3, 10, 8)  # rows not a whole number of patches
            assert torch.equal(conv(ragged), F.conv2d(ragged, conv.weight, conv.bias, stride=4))
            overlapping = _conv(kernel_size=4, stride=2)
            assert torch.equal(overlapping(x), F.conv2d(x, overlapping.weight, overlapping.bias, stride=2))


def test_checked_patch_embed_draws_the_same_weights_and_keeps_its_state_dict():
    """The class is swapped in place: the seeded generator is where plain timm leaves it, so every model
    initialised after the embedding (every seeded run) is unchanged."""
    torch.manual_seed(3)
    plain = PatchEmbed(img_size=32, patch_size=8, embed_dim=16)
    after_plain = torch.rand(1)
    torch.manual_seed(3)
    ours = CheckedPatchEmbed(img_size=32, patch_size=8, embed_dim=16)
    assert torch.equal(torch.rand(1), after_plain) and type(ours.proj) is PatchifyConv2d
    assert ours.state_dict().keys() == plain.state_dict().keys()
    assert all(torch.equal(a, b) for a, b in zip(ours.state_dict().values(), plain.state_dict().values(), strict=True))
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.allclose(ours(x).float(), plain(x).float(), atol=0.02, rtol=0.02)
    scripted = torch.jit.script(ours.proj)  # a scripted embedding keeps the convolution
    assert torch.equal(scripted(x), F.conv2d(x, ours.proj.weight, ours.proj.bias, stride=8))
