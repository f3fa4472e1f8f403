"""Linear-InfSA's opt-in stabilised variants (docs/spec/infsa.md section 3.1, issue 38).

Each variant is checked against an independent float64 formula, on the ops and on both layer paths (folded and
unfolded must agree); on a constructed input where every logit q_bar . k~_j is <= 0 the release form is dead
(zero importance, zero gradient to the scores) and the variants with no dead zone are not.
"""

from __future__ import annotations

import pytest
import timm
import torch

import linvit  # noqa: F401 - registers the models
from linvit.engine import DeadHeadStats
from linvit.errors import UsageError
from linvit.layers import LinearInfSAAttention
from linvit.ops.infsa import FLOOR_TAU, LINEAR_VARIANTS, importance_from_logits, linear_infsa, linear_infsa_importance

VARIANTS = LINEAR_VARIANTS
NO_DEAD_ZONE = ("softplus", "elu+1")


def reference_importance(q: torch.Tensor, k: torch.Tensor, variant: str, eps: float = 1e-6) -> torch.Tensor:
    """The spec's formula written out in float64, independently of linvit.ops."""
    q, k = q.double(), k.double()
    d = q.shape[-1]
    qs, ks = q / d**0.5, k / d**0.5
    energy = qs.norm(dim=-1)
    q_bar = ((energy / (energy.sum(-1, keepdim=True) + eps))[..., None] * qs).sum(2)
    s = (q_bar[:, :, None, :] * ks).sum(-1)
    r = {
        "release": s.clamp(min=0),
        "floor": s.clamp(min=0),
        "softplus": torch.log1p(torch.exp(s)),
        "elu+1": torch.where(s > 0, s + 1, torch.exp(s)),
    }[variant]
    den = r.sum(-1, keepdim=True)
    den = den.clamp_min(1e-30) if variant in NO_DEAD_ZONE else den + eps
    if variant == "floor":
        den = den + FLOOR_TAU * s.abs().mean(-1, keepdim=True)
    return r / den


def _qkv(seed: int = 0, shape=(2, 3, 9, 8)) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(*shape, generator=g, dtype=torch.float64) for _ in range(3))


def _layer(variant: str, fold_kv: bool = True, dim: int = 24, heads: int = 3, bias: bool = True):
    torch.manual_seed(0)
    return LinearInfSAAttention(dim, heads, qkv_bias=bias, fold_kv=fold_kv, linear_variant=variant).double()


def _dead_input(layer: LinearInfSAAttention, batch: int = 2, tokens: int = 6) -> torch.Tensor:
    """Inputs x where every logit q_bar . k~_j <= 0 in every head: W_k = -W_q and no bias make each token's
    key the negative of its query, and x_j > 0 with W_q >= 0 make every query lie in the positive orthant, so
    q_bar . k_j = -q_bar . q_j < 0."""
    C = layer.qkv.in_features
    with torch.no_grad():
        w_q = (torch.rand(C, C, dtype=torch.float64) + 0.1) / C  # logits of order -1: negative, not underflowing
        layer.qkv.weight[:C] = w_q
        layer.qkv.weight[C : 2 * C] = -w_q
        if layer.qkv.bias is not None:
            layer.qkv.bias.zero_()
    return torch.rand(batch, tokens, C, dtype=torch.float64) + 0.1


@pytest.mark.parametrize("variant", VARIANTS)
def test_ops_match_float64_reference(variant):
    q, k, v = _qkv()
    a = linear_infsa_importance(q, k, variant=variant)
    torch.testing.assert_close(a, reference_importance(q, k, variant), rtol=1e-12, atol=1e-14)
    out = linear_infsa(q, k, v, 0.8, variant=variant)
    expected = 0.8 * torch.einsum("bhn,bhnd->bhd", reference_importance(q, k, variant), v)
    torch.testing.assert_close(out[:, :, 0], expected, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("variant", VARIANTS)
def test_layer_folded_equals_unfolded_and_reference(variant):
    folded, unfolded = _layer(variant, True), _layer(variant, False)
    x = torch.randn(2, 7, 24, dtype=torch.float64)
    torch.testing.assert_close(folded(x), unfolded(x), rtol=1e-10, atol=1e-12)
    q, k, _ = unfolded.project_qkv(x)
    torch.testing.assert_close(folded.importance(x), reference_importance(q, k, variant), rtol=1e-10, atol=1e-12)
    chunks = list(x.split(3, dim=1))  # the streamed form (token-chunked inference) sums over chunks
    torch.testing.assert_close(folded.pooled_output(chunks).expand_as(x), folded(x), rtol=1e-10, atol=1e-12)


def test_release_is_the_default():
    assert LinearInfSAAttention(24, 3).linear_variant == "release"
    model = timm.create_model("linear_infvit_4l_patch16_224", img_size=32, patch_size=8, embed_dim=24, num_heads=3)
    assert {m.linear_variant for m in model.modules() if isinstance(m, LinearInfSAAttention)} == {"release"}


@pytest.mark.parametrize("fold_kv", [True, False])
def test_dead_input_release_has_no_gradient_variants_do(fold_kv):
    """On the constructed input the release's importance is all zero and the scores get no gradient;
    softplus and ELU + 1 give every head a non-zero, finite importance and gradient."""
    for variant in VARIANTS:
        layer = _layer(variant, fold_kv, bias=False)
        x = _dead_input(layer).requires_grad_(True)
        q, k, _ = layer.project_qkv(x)
        importance = linear_infsa_importance(q, k, variant=variant)
        layer(x).square().sum().backward()
        w_grad = layer.qkv.weight.grad[: 2 * layer.qkv.in_features]  # the Q and K rows: the scores' parameters
        assert torch.isfinite(w_grad).all() and torch.isfinite(x.grad).all()
        if variant in NO_DEAD_ZONE:
            assert (importance.sum(-1) > 0.99).all(), variant  # no dead (image, head) pair
            assert w_grad.abs().amax() > 0, variant
        else:
            assert (importance == 0).all(), variant  # every head dead, for every image
            assert w_grad.abs().amax() == 0, variant


def test_floor_bounds_the_gradient_where_the_normaliser_is_near_eps():
    """One token barely through the ReLU: the release's d a / d logit is ~1 / eps, the floor's ~1 / |logit|."""
    logits = torch.tensor([[[-1.0, -0.5, -2.0, 1e-7]]], dtype=torch.float64)
    grads = {}
    for variant in ("release", "floor"):
        s = logits.clone().requires_grad_(True)
        importance_from_logits(s, 1e-6, variant)[..., -1].sum().backward()  # the library's own formula
        grads[variant] = s.grad.abs().max().item()
    assert grads["release"] > 1e5 and grads["floor"] < 10


def test_dead_head_monitor_counts_on_the_device():
    """engine.DeadHeadStats: the layers' device-side counts, read once; the dead input counts every head."""
    release, softplus = _layer("release", bias=False), _layer("softplus", bias=False)
    net = torch.nn.ModuleList([release, softplus])
    stats = DeadHeadStats(net)
    for layer in (release, softplus):
        layer(_dead_input(layer, batch=4))
    record = stats.record(stats.values(torch.device("cpu")).tolist())
    assert record == {"dead_share": 0.5, "dead_heads": 3}  # 3 of 6 heads: the release layer's, for all 4 images
    assert not release.record_dead
    again = DeadHeadStats(net)  # the next epoch starts from zero, in the same tensors
    assert again.values(torch.device("cpu")).tolist() == [0.0] * 8


def test_the_dead_head_monitor_reports_nothing_for_layers_that_cannot_die():
    """Katz-InfSA with learned (positive) features never has all-zero scores and records no image: its runs'
    metrics had "dead_share None"; a ReLU one beside it is reported alone."""
    from linvit.layers import KatzInfSAAttention

    learned, relu = KatzInfSAAttention(24, 3, feature_map="hedgehog"), KatzInfSAAttention(24, 3)
    stats = DeadHeadStats(learned)
    learned(torch.randn(2, 7, 24))
    assert stats.record(stats.values(torch.device("cpu")).tolist()) == {}
    stats = DeadHeadStats(torch.nn.ModuleList([learned, relu]))
    learned(torch.randn(2, 7, 24)), relu(torch.zeros(2, 7, 24))  # no qkv bias: all-zero ReLU features
    assert stats.record(stats.values(torch.device("cpu")).tolist()) == {"dead_share": 1.0, "dead_heads": 3}


def test_compiled_training_with_the_dead_head_monitor_compiles_once():
    """The monitor adds in place to a tensor that lives across steps: a compiled training step is not recompiled
    (a Python counter or a None-or-tensor attribute made every step a new graph)."""
    from torch._dynamo.testing import CompileCounter

    torch._dynamo.reset()
    layer = _layer("release").float().train()
    counter = CompileCounter()
    compiled = torch.compile(layer, backend=counter, dynamic=False)
    stats = DeadHeadStats(layer)
    for _ in range(5):
        compiled(torch.randn(2, 7, 24)).sum().backward()
    assert counter.frame_count == 1
    assert stats.values(torch.device("cpu"))[-1].item() == 10  # 5 steps x 2 images


@pytest.mark.parametrize("variant", VARIANTS)
def test_compile_fullgraph_equals_eager(variant):
    layer = _layer(variant).float().eval()
    x = torch.randn(2, 7, 24)
    compiled = torch.compile(layer, fullgraph=True, backend="eager")
    torch.testing.assert_close(compiled(x), layer(x), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("variant", NO_DEAD_ZONE + ("floor",))
def test_autocast_keeps_float32_sums(variant):
    layer = _layer(variant).float().eval()
    x = torch.randn(2, 7, 24)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        a = layer.importance(x)
    assert a.dtype == torch.float32


def test_variant_flag_errors():
    with pytest.raises(UsageError, match="linear_variant must be one of"):
        timm.create_model("linear_infvit_4l_patch16_224", linear_variant="gelu")
    with pytest.raises(UsageError, match="linear_variant must be one of"):
        LinearInfSAAttention(24, 3, linear_variant="relu")
    q, k, v = _qkv()
    with pytest.raises(UsageError, match="linear_variant must be one of"):
        linear_infsa(q, k, v, 0.9, variant="nope")


def test_model_flag_reaches_every_layer():
    model = timm.create_model(
        "linear_infvit_4l_patch16_224", linear_variant="softplus", img_size=32, patch_size=8, embed_dim=24, num_heads=3
    )
    layers = [m for m in model.modules() if isinstance(m, LinearInfSAAttention)]
    assert len(layers) == 4 and {m.linear_variant for m in layers} == {"softplus"}


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    from linvit.data import build_cluttered_mnist

    root = tmp_path_factory.mktemp("cmnist")
    build_cluttered_mnist(root, canvas=32, per_class_train=3, per_class_val=1, clutter=1, progress=False)
    return root


@pytest.mark.parametrize(
    ("model", "extra", "has_dead"),
    [
        ("linear_infvit_tiny_patch16_224", ["linear_variant=softplus"], True),
        ("infvit_tiny_patch16_224", [], True),
        ("katz_infvit_tiny_patch16_224", [], True),
        ("deit_tiny_patch16_224", [], False),
    ],
)
def test_training_records_the_dead_share(data, tmp_path, model, extra, has_dead):
    """metrics.jsonl has dead_share / dead_heads for every InfSA family, and neither for softmax."""
    import json

    from linvit.cli import main as cli_main

    args = ["train", "--data", str(data), "--model", model, "--output", str(tmp_path), "--epochs", "1"]
    args += ["--batch-size", "10", "--img-size", "32", "--aa", "none", "--mixup", "0", "--cutmix", "0"]
    args += ["--reprob", "0", "--warmup-epochs", "0", "--workers", "0", "--no-progress", "--crop-pct", "1.0"]
    args += ["--model-kwargs", "patch_size=8", "depth=2", *extra]
    assert cli_main(args) == 0
    row = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[-1])
    if has_dead:
        assert 0.0 <= row["dead_share"] <= 1.0 and 0 <= row["dead_heads"]
        if extra == ["linear_variant=softplus"]:  # scores never zero: nothing is dead
            assert row["dead_share"] == 0.0 and row["dead_heads"] == 0
    else:
        assert "dead_share" not in row and "dead_heads" not in row


def test_convert_takes_a_linear_variant():
    """convert(..., linear_variant=) and the commands' --convert linear_infsa:V; the rebuild keeps the variant."""
    from linvit.conversion import convert, convert_if_asked

    def source():
        return timm.create_model("vit_tiny_patch16_224", img_size=32, patch_size=8, depth=2, num_classes=10)

    model = source()
    convert_if_asked(model, "linear_infsa:softplus")
    layers = [m for m in model.modules() if isinstance(m, LinearInfSAAttention)]
    assert len(layers) == 2 and {m.linear_variant for m in layers} == {"softplus"}
    assert model._model_args["linear_variant"] == "softplus"
    rebuilt = timm.create_model("infsa_converted", **model._model_args)
    assert {m.linear_variant for m in rebuilt.modules() if isinstance(m, LinearInfSAAttention)} == {"softplus"}
    plain = convert(source(), "linear_infsa")
    assert "linear_variant" not in plain._model_args  # release-form conversions' configs are unchanged
    with pytest.raises(UsageError, match="linear_variant must be one of"):
        convert(source(), "linear_infsa", linear_variant="bogus")


def test_cli_rejects_an_unknown_convert_variant(capsys):
    from linvit.cli import main as cli_main

    with pytest.raises(SystemExit) as err:
        cli_main(["eval", "--model", "vit_tiny_patch16_224", "--data", ".", "--convert", "linear_infsa:bogus"])
    assert err.value.code == 2 and "linear_infsa:softplus" in capsys.readouterr().err


@pytest.mark.parametrize("variant", VARIANTS)
def test_torchscript_equals_eager(variant):
    """The layers script (module globals are not TorchScript values: the normaliser uses literals)."""
    layer = _layer(variant).float().eval()
    x = torch.randn(2, 7, 24)
    torch.testing.assert_close(torch.jit.script(layer)(x), layer(x), rtol=1e-5, atol=1e-6)
