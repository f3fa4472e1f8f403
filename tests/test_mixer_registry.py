"""A new mixer is one registration (issue 47.1): a toy layer defined here, registered with linvit.register_mixer,
works through every tool without touching any other file: timm.create_model of an InfViT, linvit.convert,
`linvit distill --mixer`, explain's maps (or a one-line "no map"), the command line's choices and the conformance
matrix's enumeration; then it is gone again. Old spellings still work, with a DeprecationWarning."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import timm
import torch
from timm.layers import Attention

import linvit
import linvit_cli
from linvit.errors import UsageError
from linvit.explain.maps import importance_maps
from linvit.mixers import get_mixer

TOY = "toy_mean"
TINY = dict(depth=2, embed_dim=32, num_heads=2, num_classes=3)


class MeanMixer(Attention):
    """Every token gets the mean of the values: timm Attention's constructor and projections, its own mixing."""

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None, **kwargs) -> torch.Tensor:
        B, N, C = x.shape
        v = self.qkv(x)[..., 2 * C :].mean(1, keepdim=True)
        return self.proj_drop(self.proj(self.norm(v.expand(B, N, C))))


@pytest.fixture
def toy():
    with linvit.registered_mixer(TOY, MeanMixer) as mixer:
        yield mixer
    assert TOY not in linvit.list_mixers()


def _images(size: int = 32) -> torch.Tensor:
    return torch.randn(2, 3, size, size, generator=torch.Generator().manual_seed(0))


def test_an_infvit_builds_with_the_toy_through_timm_and_mixes_as_it_says(toy):
    assert TOY in linvit.list_mixers()
    model = timm.create_model("infvit_tiny_patch16_224", mixer=TOY, **TINY).eval()
    layers = [b.attn for b in model.blocks]
    assert model.mixer == TOY and all(type(a) is MeanMixer for a in layers)
    x = torch.randn(2, 5, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    layer = layers[0].double()
    w_v, b_v = layer.qkv.weight[64:], layer.qkv.bias
    b_v = 0 if b_v is None else b_v[64:]
    expected = (x @ w_v.T + b_v).mean(1, keepdim=True) @ layer.proj.weight.T + layer.proj.bias
    torch.testing.assert_close(layer(x), expected.expand(2, 5, 32), rtol=1e-12, atol=1e-12)
    assert torch.isfinite(model.float()(_images())).all()


def test_convert_puts_the_toy_in_carrying_the_projections(toy):
    torch.manual_seed(0)
    source = timm.create_model("vit_4l_patch16_224", **TINY).eval()
    before = [(b.attn.qkv.weight.clone(), b.attn.proj.weight.clone()) for b in source.blocks]
    model = linvit.convert(source, TOY)
    assert all(type(b.attn) is MeanMixer for b in model.blocks)
    for block, (qkv, proj) in zip(model.blocks, before, strict=True):
        assert torch.equal(block.attn.qkv.weight, qkv) and torch.equal(block.attn.proj.weight, proj)
    report = linvit.convert_report(model)
    assert report.variant == TOY and len(report.converted) == 2
    with pytest.raises(UsageError, match=f"^{TOY} takes no ':option'"):
        linvit.convert(timm.create_model("vit_4l_patch16_224", **TINY), f"{TOY}:x")
    from linvit.conversion import FORMS, VARIANTS

    assert TOY in VARIANTS and TOY in FORMS and "softmax" not in VARIANTS


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    from linvit.data import build_cluttered_mnist

    root = tmp_path_factory.mktemp("registrydata")
    build_cluttered_mnist(root, canvas=32, per_class_train=2, per_class_val=1, clutter=1, progress=False)
    return root


def test_distill_takes_the_toy_as_its_mixer_and_the_run_reloads_with_it(toy, digits, tmp_path):
    argv = ["distill", "--teacher", "vit_4l_patch16_224", "--model-kwargs", "patch_size=8", "embed_dim=32"]
    argv += ["depth=2", "num_heads=2", "num_classes=10", "--data", str(digits), "--img-size", "32"]
    argv += ["--mixer", TOY, "--workers", "0", "--device", "cpu", "--no-progress", "--batch-size", "8"]
    argv += ["--epochs", "1", "--output", str(tmp_path / "run")]
    assert linvit_cli.main(argv) == 0
    student = linvit.load_run(tmp_path / "run")
    assert linvit.convert_report(student).variant == TOY
    assert sum(type(m) is MeanMixer for m in student.modules()) == 2


def test_explain_maps_the_toy_by_gradients_and_names_the_maps_it_has_not(toy):
    model = timm.create_model("infvit_tiny_patch16_224", mixer=TOY, **TINY)
    maps = importance_maps(model, _images())
    assert maps.method == "grad" and maps.patch.shape == (2, 2, 2) and torch.isfinite(maps.patch).all()
    for method in ("rollout", "column", "linear"):
        with pytest.raises(UsageError, match=f"its {TOY} mixer has no '{method}' map .try method='grad'.$"):
            importance_maps(model, _images(), method=method)


def test_the_command_lines_choices_are_the_registrys(toy):
    assert TOY in linvit_cli.CONVERT_VARIANTS and TOY in list(linvit_cli.CONVERT_VARIANTS)
    assert TOY in linvit_cli.DIT_MIXERS and TOY in list(linvit_cli.DIT_MIXERS)
    linvit.unregister_mixer(TOY)
    try:
        assert TOY not in linvit_cli.CONVERT_VARIANTS and TOY not in list(linvit_cli.DIT_MIXERS)
        with pytest.raises(SystemExit):
            linvit_cli.main(["distill", "--teacher", "x", "--data", "x", "--output", "x", "--mixer", TOY])
    finally:
        linvit.register_mixer(TOY, MeanMixer)


def test_the_conformance_matrix_enrols_the_toy(toy, monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).parent / "conformance"))
    import conformance_entries as entries

    layers = {name: build for name, build in entries.mixer_entries()}
    assert f"{TOY}()" in layers and type(layers[f"{TOY}()"]()) is MeanMixer
    for entry in [e for e in entries.dit_entries() + entries.student_entries() if e.id.endswith(f":{TOY}")]:
        model = entry.model()
        assert any(type(m) is MeanMixer for m in model.modules())
        assert torch.isfinite(entries.output_tensor(model(*entry.inputs(2, torch.float32, 0)))).all()
    assert {e.id for e in entries.dit_entries() + entries.student_entries()} >= {f"dit:{TOY}", f"student:{TOY}"}


def test_a_name_registers_once_and_the_decorator_registers_too(toy):
    for name in (TOY, "katz_infsa", "katz"):  # a name, or an earlier spelling, already taken
        with pytest.raises(UsageError, match=f"^cannot register mixer {name!r}: {name!r} is already registered$"):
            linvit.register_mixer(name, MeanMixer)
    with pytest.raises(UsageError, match="takes a layer class"):
        linvit.register_mixer("toy_instance", MeanMixer(8))
    with pytest.raises(UsageError, match="unknown limits"):
        linvit.register_mixer("toy_limited", MeanMixer, cannot=("fly",))
    with pytest.raises(UsageError, match="^unknown mixer 'toy_absent'; choose from softmax, pure_infsa"):
        linvit.unregister_mixer("toy_absent")

    @linvit.register_mixer("toy_decorated")
    class Decorated(MeanMixer):
        pass

    try:
        assert get_mixer("toy_decorated").cls is Decorated and linvit.list_mixers()[-2:] == [TOY, "toy_decorated"]
    finally:
        linvit.unregister_mixer("toy_decorated")
    assert "toy_decorated" not in linvit.list_mixers()


def test_each_mixer_has_one_spelling_and_the_old_ones_warn():
    assert linvit.list_mixers() == [
        "softmax",
        "pure_infsa",
        "linear_infsa",
        "katz_infsa",
        "katz_rows",
        "linear_attention",
    ]
    for old, new in (("pure", "pure_infsa"), ("linear", "linear_infsa"), ("katz", "katz_infsa")):
        with pytest.warns(DeprecationWarning, match=f"^mixer '{old}' is deprecated, use '{new}'$"):
            model = timm.create_model("infvit_tiny_patch16_224", mixer=old, **TINY)
        assert model.mixer == new and type(model.blocks[0].attn) is get_mixer(new).cls
        with pytest.warns(DeprecationWarning):
            assert linvit.models.create_dit(mixer=old).mixer == new
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the registered models spell their mixers the one way
        assert timm.create_model("katz_infvit_tiny_patch16_224", **TINY).mixer == "katz_infsa"
        assert timm.create_model("linear_infvit_tiny_patch16_224", **TINY).mixer == "linear_infsa"
