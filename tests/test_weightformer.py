"""WeightFormer: dynamic layers against float64 per-sample references, models, official checkpoints."""

from __future__ import annotations

from pathlib import Path

import pytest
import timm
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st
from safetensors.torch import save_file

import linvit
from conftest import assert_checkpointing_keeps_gradients, rel_err
from linvit.layers import CONV_PREDICTORS, LINEAR_PREDICTORS, DynamicDWConv, DynamicLinear
from linvit.weights import load_checkpoint
from reference_weightformer import RefWeightFormer

WF_MODELS = ["weightformer_tiny_patch16_224", "weightformer_small_patch16_224", "weightformer_base_patch16_448"]


def _randomize(module: torch.nn.Module, std: float = 0.3) -> None:
    """Large random parameters so dW is far from negligible and the normalisation is exercised."""
    with torch.no_grad():
        for p in module.parameters():
            p.normal_(0, std)


def dynamic_linear_ref(layer: DynamicLinear, x: torch.Tensor, grid) -> torch.Tensor:
    """Bilateral predictor, one sample at a time, float64, loops over output columns for the norm."""
    H, W = grid
    cin = layer.in_features
    outs = []
    for xi in x.double():
        g = xi.T.reshape(cin, H, W)
        Hp, Wp = H // 2, W // 2
        pooled = g[:, : 2 * Hp, : 2 * Wp].reshape(cin, Hp, 2, Wp, 2).mean(dim=(2, 4)).reshape(cin, -1).T
        z = pooled @ layer.wfm.weight.double().T + layer.wfm.bias.double()
        r_in = layer.split[0]
        p = F.silu(z[:, :r_in]) @ layer.w1.double()
        r = F.silu(z[:, r_in:]) @ layer.w2.double()
        dw = p.T @ r / (cin**0.5 * H * W)
        for j in range(dw.shape[1]):
            dw[:, j] = dw[:, j] / (dw[:, j].norm() + 1)
        outs.append(xi @ (layer.w.double() + dw) + layer.b.double())
    return torch.stack(outs)


def dynamic_dwconv_ref(layer: DynamicDWConv, x: torch.Tensor) -> torch.Tensor:
    """Adaptive predictor, one sample at a time, float64, the 3x3 regions pooled by hand."""
    C, H, W = x.shape[1:]
    outs = []
    for xi in x.double():
        pooled = torch.empty(C, 3, 3, dtype=torch.float64)
        for i in range(3):
            for j in range(3):  # adaptive pooling bins: [floor(i*H/3), ceil((i+1)*H/3))
                h0, h1 = (i * H) // 3, -((-(i + 1) * H) // 3)
                w0, w1 = (j * W) // 3, -((-(j + 1) * W) // 3)
                pooled[:, i, j] = xi[:, h0:h1, w0:w1].mean(dim=(1, 2))
        hidden = torch.einsum("oc,cij->oij", layer.wfm[0].weight.double()[:, :, 0, 0], pooled)
        hidden = F.gelu(hidden + layer.wfm[0].bias.double()[:, None, None])
        dk = torch.einsum("oc,cij->oij", layer.wfm[2].weight.double()[:, :, 0, 0], hidden)
        dk = dk / (dk.flatten(1).norm(dim=1)[:, None, None] + 1)
        kernel = layer.w.double() + dk[:, None]
        outs.append(F.conv2d(xi[None], kernel, layer.b.double(), padding=1, groups=C)[0])
    return torch.stack(outs)


@given(h=st.integers(2, 9), w=st.integers(2, 9), batch=st.integers(1, 3))
def test_dynamic_linear_matches_float64_per_sample_reference(h, w, batch):
    layer = DynamicLinear(16, 24)
    _randomize(layer)
    x = torch.randn(batch, h * w, 16)
    assert rel_err(layer(x, (h, w)), dynamic_linear_ref(layer, x, (h, w))) <= 1e-5


@given(h=st.integers(1, 10), w=st.integers(1, 10), batch=st.integers(1, 3))
def test_dynamic_dwconv_matches_float64_per_sample_reference(h, w, batch):
    layer = DynamicDWConv(8)
    _randomize(layer)
    x = torch.randn(batch, 8, h, w)
    assert rel_err(layer(x), dynamic_dwconv_ref(layer, x)) <= 1e-5


@pytest.mark.parametrize("predictor", LINEAR_PREDICTORS)
def test_dynamic_linear_batch_independence_and_every_predictor_trains(predictor):
    layer = DynamicLinear(16, 32, predictor=predictor)
    _randomize(layer)
    x = torch.randn(3, 5 * 7, 16, requires_grad=True)
    out = layer(x, (5, 7))
    for i in range(3):
        assert rel_err(layer(x[i : i + 1], (5, 7)), out[i : i + 1]) <= 1e-6
    # the weight really is per sample: swapping the other samples changes nothing, changing this one does
    dw = layer.delta_weight(x, (5, 7))
    assert not torch.allclose(dw[0], dw[1])
    out.square().sum().backward()
    assert x.grad is not None and all(p.grad is not None and p.grad.abs().sum() > 0 for p in layer.parameters())


@pytest.mark.parametrize("predictor", CONV_PREDICTORS)
def test_dynamic_dwconv_batch_independence_and_every_predictor_trains(predictor):
    layer = DynamicDWConv(8, predictor=predictor)
    _randomize(layer)
    x = torch.randn(3, 8, 7, 5, requires_grad=True)
    out = layer(x)
    for i in range(3):
        assert rel_err(layer(x[i : i + 1]), out[i : i + 1]) <= 1e-6
    out.square().sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in layer.parameters())


def test_normalised_updates_stay_below_unit_norm():
    layer = DynamicLinear(16, 32)
    _randomize(layer, std=3.0)
    dw = layer.delta_weight(torch.randn(2, 36, 16) * 10, (6, 6))
    assert (dw.norm(dim=1) < 1).all()
    conv = DynamicDWConv(8)
    _randomize(conv, std=3.0)
    assert (conv.delta_kernel(torch.randn(2, 8, 9, 9) * 10).flatten(2).norm(dim=-1) < 1).all()


def test_dynamic_layers_reject_bad_input():
    layer = DynamicLinear(16, 32)
    with pytest.raises(ValueError, match="channels"):
        layer(torch.randn(1, 12, 8), (3, 4))
    with pytest.raises(ValueError, match="grid"):
        layer(torch.randn(1, 12, 16), (5, 5))
    with pytest.raises(ValueError, match="too small"):
        layer(torch.randn(1, 5, 16), (1, 5))
    with pytest.raises(ValueError, match=r"\(B, 8, H, W\)"):
        DynamicDWConv(8)(torch.randn(1, 4, 5, 5))
    with pytest.raises(ValueError, match="predictor"):
        DynamicLinear(16, predictor="attention")


@pytest.mark.parametrize("name", WF_MODELS)
def test_models_build_train_a_step_at_any_grid(name):
    model = timm.create_model(name, num_classes=5)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = torch.randn(2, 3, 80, 112), torch.tensor([1, 3])
    losses = []
    for _ in range(3):
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]
    assert model(torch.randn(1, 3, 48, 208)).shape == (1, 5)  # 3 x 13 grid: odd, non-square


def test_tiny_has_the_official_size_and_layout():
    model = timm.create_model("weightformer_tiny_patch16_224")
    assert sum(p.numel() for p in model.parameters()) == 7_074_184
    keys = model.state_dict().keys()
    assert len(keys) == 198
    assert model.dynamic_blocks == [1, 4, 7, 10, 13, 16]
    for k in ["blocks.1.linear1.wfm.weight", "blocks.1.linear1.w", "blocks.1.dwc.wfm.2.weight", "blocks.0.dwc.weight"]:
        assert k in keys
    assert set(keys) == set(RefWeightFormer().state_dict().keys())


def test_ablation_kwargs():
    static = timm.create_model("weightformer_tiny_patch16_224", dynamic_interval=0)
    assert static.dynamic_blocks == [] and not any(isinstance(m, DynamicLinear) for m in static.modules())
    dense = timm.create_model("weightformer_tiny_patch16_224", dynamic_interval=1, linear_predictor="gap")
    assert dense.dynamic_blocks == list(range(17)) and dense.blocks[0].linear1.predictor == "gap"
    every2 = timm.create_model("weightformer_tiny_patch16_224", dynamic_interval=2, conv_predictor="gap")
    assert every2.dynamic_blocks == list(range(1, 17, 2)) and every2.blocks[1].dwc.predictor == "gap"


@pytest.mark.parametrize("suffix", [".pth", ".safetensors"])
def test_official_checkpoint_loads_strictly_and_reproduces_reference_logits(tmp_path, suffix):
    ref = RefWeightFormer().eval()
    path = tmp_path / f"weightformer_t{suffix}"
    state = {k: v.contiguous() for k, v in ref.state_dict().items()}
    save_file(state, path) if suffix == ".safetensors" else torch.save({"model": state, "epoch": 299}, path)
    x = torch.randn(2, 3, 224, 224)
    expected = ref(x)

    direct = timm.create_model("weightformer_tiny_patch16_224").eval()
    direct.load_state_dict(state, strict=True)
    via_timm = timm.create_model(
        "weightformer_tiny_patch16_224", pretrained=True, pretrained_cfg_overlay=dict(file=str(path))
    ).eval()
    via_helper = load_checkpoint(timm.create_model("weightformer_tiny_patch16_224"), path).eval()
    with torch.no_grad():
        for model in (direct, via_timm, via_helper):
            assert rel_err(model(x), expected) <= 1e-5


def test_wrong_checkpoint_fails_with_clear_error(tmp_path):
    small = tmp_path / "small.pth"
    torch.save(timm.create_model("weightformer_small_patch16_224").state_dict(), small)
    with pytest.raises(ValueError, match="shape mismatches"):
        load_checkpoint(timm.create_model("weightformer_tiny_patch16_224"), small)
    vit = tmp_path / "vit.pth"
    torch.save(timm.create_model("linear_infvit_tiny_patch16_224").state_dict(), vit)
    with pytest.raises(ValueError, match="missing"):
        timm.create_model("weightformer_tiny_patch16_224", pretrained=True, pretrained_cfg_overlay=dict(file=str(vit)))


def test_checkpoint_loading_never_executes_code(tmp_path):
    class Boom:
        def __reduce__(self):
            return (exec, ("raise SystemExit('code ran')",))

    path = tmp_path / "evil.pth"
    torch.save({"model": Boom()}, path)
    with pytest.raises(Exception) as info:
        load_checkpoint(timm.create_model("weightformer_tiny_patch16_224"), path)
    assert not isinstance(info.value, SystemExit)


def test_timm_features():
    feats = timm.create_model("weightformer_tiny_patch16_224", features_only=True, out_indices=(4, 10, 16))
    outs = feats(torch.randn(1, 3, 64, 96))
    assert [o.shape for o in outs] == [(1, 192, 4, 6)] * 3
    assert feats.feature_info.channels() == [192] * 3 and feats.feature_info.reduction() == [16] * 3
    model = timm.create_model("weightformer_tiny_patch16_224", num_classes=4)
    x = torch.randn(2, 3, 64, 64)
    assert_checkpointing_keeps_gradients(model, x)
    assert model.forward_head(model.forward_features(x), pre_logits=True).shape == (2, 192)
    model.reset_classifier(0)
    assert model(x).shape == (2, 192)


@pytest.mark.parametrize("x,msg", [(torch.randn(1, 4, 64, 64), "channels"), (torch.randn(1, 3, 64, 72), "divisible")])
def test_model_rejects_bad_input(x, msg):
    with pytest.raises(ValueError, match=msg):
        timm.create_model("weightformer_tiny_patch16_224")(x)


def test_registered_with_linvit():
    assert set(WF_MODELS) <= set(linvit.list_models())


@pytest.mark.parametrize("linear_predictor", ["bilateral", "gap", "linear"])
@pytest.mark.parametrize("grid", [(7, 9), (8, 5)])  # odd rows: the last band has one row; odd columns
def test_row_band_inference_equals_the_whole_map(linear_predictor, grid):
    model = timm.create_model(
        "weightformer_tiny_patch16_224", num_classes=4, depth=5, embed_dim=32, linear_predictor=linear_predictor
    ).eval()
    x = torch.randn(2, 3, grid[0] * 16, grid[1] * 16)
    with torch.no_grad():
        model.set_token_chunk(None)
        whole = model(x)
        for chunk in (1, 20, 10_000):  # bands of 2 rows (the minimum), of 2 or 4 rows, one band
            model.set_token_chunk(chunk)
            torch.testing.assert_close(model(x), whole, rtol=1e-5, atol=1e-5)
    model.set_token_chunk(20)
    model(x).sum().backward()  # autograd on: the ordinary path
    assert model.blocks[1].linear1.w.grad is not None


def test_residual_folded_into_the_depthwise_kernel():
    torch.manual_seed(0)
    conv = DynamicDWConv(8)
    x = torch.randn(2, 8, 6, 7)
    torch.testing.assert_close(conv(x, residual=True), x + conv(x), rtol=1e-5, atol=1e-6)
    with torch.no_grad():  # the kernel with the identity tap follows in-place updates
        first = conv(x, residual=True)
        conv.w.add_(0.5)
        assert not torch.allclose(conv(x, residual=True), first)
        torch.testing.assert_close(conv(x, residual=True), x + conv(x), rtol=1e-5, atol=1e-6)


def _spec_table() -> list[dict]:
    """docs/spec/weightformer.md's model table as {column title: cell} rows."""
    lines = (Path(__file__).parents[1] / "docs" / "spec" / "weightformer.md").read_text().splitlines()
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in lines if line.startswith("| ")]
    header = next(r for r in rows if r[0] == "model")
    return [dict(zip(header, r, strict=True)) for r in rows if r[0].startswith("`weightformer_")]


def _gmacs(name: str, side: int, release_order: bool, monkeypatch) -> float:
    """GMACs of one image as `linvit models --macs` counts them (torch's FLOP counter), on the meta device;
    with release_order, the correlation always in the release's association (maps per token first)."""
    from linvit.layers import dynamic
    from linvit.utils.flops import count_flops

    in_order = dynamic._correlation_in_order
    if release_order:
        monkeypatch.setattr(dynamic, "_correlation_in_order", lambda lt, lm, rt, rm, _: in_order(lt, lm, rt, rm, True))
    with torch.device("meta"), torch.no_grad():
        model = timm.create_model(name).eval()
        flops = count_flops(lambda: model(torch.zeros(1, 3, side, side)))
    monkeypatch.setattr(dynamic, "_correlation_in_order", in_order)
    return flops / 2e9


def test_spec_macs_are_what_the_code_counts_and_the_release_order_gives(monkeypatch):
    table = _spec_table()
    assert {r["model"].strip("`") for r in table} == set(WF_MODELS)
    for row in table:
        name, side = row["model"].strip("`"), int(row["input"])
        for column, release_order in [("MACs", False), ("MACs, release's order", True)]:
            digits = len(row[column].rstrip("G").partition(".")[2])
            counted = round(_gmacs(name, side, release_order, monkeypatch), digits)
            assert f"{counted:.{digits}f}G" == row[column], (name, column)


@pytest.mark.parametrize("width, keeps_up_to", [(192, 48), (384, 96)])
def test_release_order_holds_up_to_the_documented_pooled_token_count(width, keeps_up_to, monkeypatch):
    """The switch points docs/spec/weightformer.md states: WeightFormer-T (C = 192) takes the core-first order from
    M = 49 pooled tokens on, which is 224 px; WeightFormer-S (C = 384) keeps the release's order there."""
    from linvit.layers import dynamic

    chosen = []
    in_order = dynamic._correlation_in_order
    monkeypatch.setattr(dynamic, "_correlation_in_order", lambda *a: chosen.append(a[-1]) or in_order(*a))
    layer = DynamicLinear(width, 4 * width)
    for m in (keeps_up_to, keeps_up_to + 1):
        layer.correlation_of_pooled(torch.randn(1, m, width), 4 * m)
    assert chosen == [True, False]
    spec = (Path(__file__).parents[1] / "docs" / "spec" / "weightformer.md").read_text()
    assert f"C = {width}: M <= {keeps_up_to}" in spec
