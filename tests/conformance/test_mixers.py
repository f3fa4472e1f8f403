"""Every mixer layer (conformance_entries.mixer_entries) and functional op, in every precision (issue 39).

The dtype contract (docs/numerics.md): a mixer returns what timm's Attention returns, the
autocast dtype under autocast and the input's dtype otherwise. A head whose scores are all zero (W_q = 0) or
all negative stays finite in float16, forward and backward, under autocast and after `.half()`.
"""

from __future__ import annotations

import copy

import pytest
import torch
from conformance_entries import HEADS, WIDTH, literal_options, mixer_entries

import linvit
from conftest import rel_err
from linvit.errors import UsageError
from linvit.models.infvit import InfViT
from linvit.ops import katz_infsa, linear_infsa, pure_infsa
from linvit.ops.katz_causal import causal_katz_chunked, causal_katz_recurrent

MIXERS = mixer_entries()
IDS = [m[0] for m in MIXERS]
PRECISIONS = [("float32", 1e-5), ("autocast-bfloat16", 1e-2), ("autocast-float16", 5e-3), ("half-float16", 5e-3)]


LAYERS = {n: linvit.get_mixer(n).cls for n in linvit.list_mixers()}
LAYER_OPTIONS = [(n, o) for n, cls in LAYERS.items() for o in literal_options(cls)]


@pytest.mark.parametrize("layer, option", LAYER_OPTIONS, ids=[f"{n}.{o}" for n, o in LAYER_OPTIONS])
def test_an_options_literal_type_is_what_the_layer_accepts_and_the_model_passes_on(layer, option):
    """The matrix enrols the values a Literal names: each builds, anything else is refused in one line naming
    the option, and InfViT takes the same type (so the classifier entries reach every value)."""
    values, default = literal_options(LAYERS[layer])[option]
    assert default in values
    for value in values:
        LAYERS[layer](WIDTH, num_heads=HEADS, **{option: value})
    with pytest.raises(UsageError, match=f"^{option} must be one of .*; got 'bogus'$"):
        LAYERS[layer](WIDTH, num_heads=HEADS, **{option: "bogus"})
    assert values in [v for v, _ in literal_options(InfViT).values()], f"InfViT has no {option} option"


def _tokens(batch: int = 2, n: int = 16, dtype=torch.float32) -> torch.Tensor:
    return (torch.randn(batch, n, WIDTH, generator=torch.Generator().manual_seed(0)) + 0.3).to(dtype)


def _call(layer, x, mode: str) -> torch.Tensor:
    if mode.startswith("autocast"):
        with torch.autocast("cpu", dtype=torch.bfloat16 if mode.endswith("bfloat16") else torch.float16):
            return layer(x)
    return layer(x)


def _prepared(layer, mode: str):
    return (layer.half(), _tokens(dtype=torch.float16)) if mode.startswith("half") else (layer, _tokens())


@pytest.mark.parametrize("mode, tol", PRECISIONS, ids=[p[0] for p in PRECISIONS])
@pytest.mark.parametrize("build", [m[1] for m in MIXERS], ids=IDS)
def test_mixer_against_float64_and_its_output_dtype(build, mode, tol):
    layer = build().eval()
    with torch.no_grad():
        reference = copy.deepcopy(layer).double()(_tokens(dtype=torch.float64))
    layer, x = _prepared(layer, mode)
    out = _call(layer, x, mode)
    expected_dtype = torch.bfloat16 if "bfloat16" in mode else torch.float16 if "float16" in mode else torch.float32
    assert out.dtype == expected_dtype, f"{mode}: returns {out.dtype}"
    assert rel_err(out, reference) <= tol, f"{mode}: {rel_err(out, reference):.2e} > {tol:g}"
    out.float().sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in layer.parameters() if p.grad is not None)


@pytest.mark.parametrize("mode", ["float32", "autocast-float16", "half-float16", "autocast-bfloat16"])
@pytest.mark.parametrize("build", [m[1] for m in MIXERS], ids=IDS)
def test_a_head_whose_scores_are_all_zero_stays_finite(build, mode):
    layer = build().eval()
    with torch.no_grad():  # head 0's queries are zero: every score of that head is 0
        layer.qkv.weight[: layer.head_dim].zero_()
        layer.qkv.bias[: layer.head_dim].zero_()
    layer, x = _prepared(layer, mode)
    x.requires_grad_(True)
    out = _call(layer, x, mode)
    assert torch.isfinite(out).all(), f"{mode}: non-finite output"
    out.float().sum().backward()
    assert torch.isfinite(x.grad).all()
    assert all(torch.isfinite(p.grad).all() for p in layer.parameters() if p.grad is not None)


def _pure_causal(q, k, v, g):
    return pure_infsa(q, k, v, g, attn_mask=torch.ones(q.shape[2], q.shape[2], dtype=torch.bool).tril())


OPS = {
    "pure-dense": lambda q, k, v, g: pure_infsa(q, k, v, g, impl="dense"),
    "pure-chunked": lambda q, k, v, g: pure_infsa(q, k, v, g, impl="chunked", block_size=5),
    "pure-causal": _pure_causal,
    "linear": linear_infsa,
    "katz": katz_infsa,
    "katz-causal-chunked": lambda q, k, v, g: causal_katz_chunked(q, k, v, g, feature_map="relu", chunk_size=8)[0],
    "katz-causal-recurrent": lambda q, k, v, g: causal_katz_recurrent(q, k, v, g, feature_map="relu")[0],
}


@pytest.mark.parametrize("op", OPS.values(), ids=OPS.keys())
def test_ops_in_float16_with_a_head_of_negative_scores(op):
    """Head 0: every q . k < 0 (and so every ReLU score 0); head 1 ordinary. float16 is finite everywhere
    (forward and backward) and within 5e-3 of float64 on the same rounded inputs."""
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 2, 23, 8, generator=gen) for _ in range(3))
    q[:, 0], k[:, 0] = -q[:, 0].abs() - 0.1, k[:, 0].abs() + 0.1
    q[:, 1], k[:, 1] = q[:, 1] + 0.5, k[:, 1] + 0.5
    half = [t.half().requires_grad_() for t in (q, k, v)]
    out = op(*half, 0.9)
    reference = op(*(t.detach().double() for t in half), 0.9)
    assert out.dtype == torch.float16 and torch.isfinite(out).all()
    assert rel_err(out, reference) <= 5e-3
    out.float().sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in half)


def test_dense_pure_infsa_in_float16_at_2048_tokens():
    """The dense form summed scores @ v in float16 before scaling: at N = 2048 the unnormalised sums pass
    float16's 65504 (the normalised output is ~1)."""
    gen = torch.Generator().manual_seed(0)
    q, k, v = ((torch.randn(1, 1, 2048, 16, generator=gen) + 4.0).half() for _ in range(3))  # sums ~1.3e5
    out = pure_infsa(q, k, v, 0.9, impl="dense")
    reference = pure_infsa(q.double(), k.double(), v.double(), 0.9, impl="dense")
    assert torch.isfinite(out).all()
    assert rel_err(out, reference) <= 5e-3
