"""What the conformance matrix checks: every model linvit registers, found at collection time, never listed.

- classifiers: every name of `linvit.list_models()` (timm's registry filtered to linvit's modules), with every
  ':variant' suffix that applies to it (models.variants.VARIANTS), built tiny (2 blocks, width 32);
- DiT: one per mixer of `linvit.models.dit.MIXERS`;
- distillation students: a tiny softmax ViT converted to each of `linvit.convert`'s forms (linvit.distill;
  conversion.FORMS: every variant and each of its options, e.g. `katz_infsa:hedgehog`);
- language models: GPT-2, Llama, Qwen3 and Mistral on tiny random configs, converted by `linvit.convert` to
  every form a causal model accepts (pure InfSA, causal Katz-InfSA and its learned feature map; each that takes
  a sliding window also with window=4, `+window4`);
- mixers: every attention layer of `linvit.models.infvit.MIXERS` with each of its options.

A new family, variant, DiT mixer or mixer option is enrolled without editing this file. Tiny builds of
different names that come out identical (infvit_tiny and infvit_small at width 32: the same modules and
parameter shapes) are checked once.
"""

from __future__ import annotations

import copy
import inspect
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field

import timm
import torch
import torch.nn as nn

import linvit
from linvit.errors import UsageError
from linvit.layers import infsa_attention
from linvit.models import dit as dit_models
from linvit.models import infvit
from linvit.models.variants import VARIANTS, apply_variant

WIDTH, HEADS, IMAGE = 32, 2, 64  # 16 tokens at patch 16: WeightFormer takes multiples of 32 px
LM_VOCAB = 61


@dataclass(frozen=True)
class Entry:
    """One model of the matrix: how to build it (seeded) and feed it a batch."""

    id: str
    kind: str  # "classifier", "dit" or "lm"
    build: Callable[[], nn.Module] = field(compare=False)
    inputs: Callable[[int, torch.dtype, int], tuple] = field(compare=False)  # (batch, float dtype, seed)
    size_arg: bool = False  # inputs take an image size (H, W): the size checks apply

    def model(self) -> nn.Module:
        torch.manual_seed(0)
        return self.build().eval()


def output_tensor(out) -> torch.Tensor:
    """The tensor a model returns: logits for transformers' outputs, the tensor itself otherwise."""
    return out.logits if hasattr(out, "logits") else out


def _images(batch: int, dtype: torch.dtype, seed: int, size: tuple[int, int] = (IMAGE, IMAGE)) -> tuple:
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(batch, 3, *size, generator=gen).to(dtype),)


def _classifier(name: str, variant: str | None) -> nn.Module:
    kwargs = dict(depth=2, embed_dim=WIDTH, num_classes=5)
    try:
        model = timm.create_model(name, num_heads=HEADS, **kwargs)
    except TypeError:  # WeightFormer has no heads; interval 2 makes block 1 dynamic and block 0 static
        model = timm.create_model(name, dynamic_interval=2, **kwargs)
    return apply_variant(model, variant)


def _variant_applies(name: str, variant: str) -> bool:
    try:
        _classifier(name, variant)
    except UsageError:
        return False
    return True


def classifier_entries() -> list[Entry]:
    found: dict[str, Entry] = {}
    for name, variant in itertools.product(linvit.list_models(), (None, *VARIANTS)):
        if variant is not None and not _variant_applies(name, variant):
            continue
        torch.manual_seed(0)
        model = _classifier(name, variant)
        shapes = [(k, tuple(v.shape)) for k, v in model.state_dict().items()]  # img_size shows in pos_embed
        key = f"{variant}|{model!r}|{shapes}"
        spec = name if variant is None else f"{name}:{variant}"
        found.setdefault(
            key,
            Entry(spec, "classifier", lambda n=name, v=variant: _classifier(n, v), _images, size_arg=True),
        )
    return list(found.values())


def _dit_inputs(batch: int, dtype: torch.dtype, seed: int, size: tuple[int, int] = (8, 8)) -> tuple:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, 4, *size, generator=gen).to(dtype)
    t = torch.randint(0, 1000, (batch,), generator=gen)
    y = torch.randint(0, 3, (batch,), generator=gen)
    return x, t, y


def dit_entries() -> list[Entry]:
    def build(mixer: str) -> nn.Module:
        return dit_models.DiT(
            input_size=8, patch_size=2, hidden_size=WIDTH, depth=2, num_heads=HEADS, num_classes=3, mixer=mixer
        )

    return [Entry(f"dit:{m}", "dit", lambda m=m: build(m), _dit_inputs) for m in dit_models.MIXERS]


def _lm_inputs(batch: int, dtype: torch.dtype, seed: int) -> tuple:
    gen = torch.Generator().manual_seed(seed)
    return (torch.randint(1, LM_VOCAB, (batch, 12), generator=gen),)


def _lm(family: str, variant: str) -> nn.Module:
    import transformers

    if family == "gpt2":
        source = transformers.GPT2LMHeadModel(
            transformers.GPT2Config(vocab_size=LM_VOCAB, n_embd=WIDTH, n_layer=2, n_head=4, n_positions=64)
        )
    else:
        shape = dict(vocab_size=LM_VOCAB, hidden_size=WIDTH, intermediate_size=64, num_attention_heads=4)
        extra = {"Qwen3": dict(num_key_value_heads=1, head_dim=8), "Mistral": dict(sliding_window=32)}
        config = getattr(transformers, f"{family}Config")(
            **shape,
            num_hidden_layers=2,
            max_position_embeddings=64,
            **{"num_key_value_heads": 2, **extra.get(family, {})},
        )
        source = getattr(transformers, f"{family}ForCausalLM")(config)
    form, _, window = variant.partition("+window")  # "katz_infsa+window4": the sliding-window hybrid
    return linvit.convert(source.eval(), form, gamma_init=0.8, window=int(window) if window else None)


def _causal_forms() -> list[str]:
    """The conversion forms a causal language model accepts, one per distinct converted model (causal Katz's
    explicit "elu+1" is its default map)."""
    from linvit.conversion import FORMS

    found = {}
    for form in FORMS:
        try:
            model = _lm("gpt2", form)
        except UsageError:
            continue
        key = (model.config._attn_implementation, tuple(n for n, _ in model.named_parameters()))
        found.setdefault(key, form)
    forms = list(found.values())
    # a form that began to be refused would otherwise leave the matrix without a word
    assert set(forms) >= {"pure_infsa", "katz_infsa", "katz_infsa:hedgehog", "linear_attention"}, forms
    return forms + _windowed(forms)


def _windowed(forms: list[str]) -> list[str]:
    """Each form that takes a sliding window (linvit.convert's window=), with a window shorter than the text."""
    found = []
    for form in forms:
        try:
            _lm("gpt2", f"{form}+window4")
        except UsageError:
            continue
        found.append(f"{form}+window4")
    assert {"katz_infsa+window4", "linear_attention+window4"} <= set(found), found
    return found


def lm_entries() -> list[Entry]:
    try:
        import transformers  # noqa: F401
    except ImportError:
        return []
    families = ("gpt2", "Llama", "Qwen3", "Mistral")
    return [
        Entry(f"lm:{f}:{v}", "lm", lambda f=f, v=v: _lm(f, v), _lm_inputs) for v in _causal_forms() for f in families
    ]


def _student(variant: str) -> nn.Module:
    from linvit.distillation import make_student

    teacher = timm.create_model("vit_4l_patch16_224", depth=2, embed_dim=WIDTH, num_heads=HEADS, num_classes=5)
    return make_student(teacher, variant)


def student_entries() -> list[Entry]:
    """`linvit distill`'s students (a softmax ViT converted by linvit.convert, as `infsa_converted`), one per
    conversion form, at the size they were built for."""
    from linvit.conversion import FORMS

    return [Entry(f"student:{v}", "classifier", lambda v=v: _student(v), _images) for v in FORMS]


def model_entries() -> list[Entry]:
    return classifier_entries() + student_entries() + dit_entries() + lm_entries()


def _options(cls: type) -> list[dict]:
    """Every combination of a mixer layer's choice-valued keyword options (impl, fold_kv, feature_map, ...)."""
    layers = infsa_attention
    choices = {
        "impl": layers.PURE_IMPLS,
        "fold_kv": (True, False),
        "feature_map": layers.FEATURE_MAPS,
        "linear_variant": layers.LINEAR_VARIANTS,
    }
    names = [n for n in inspect.signature(cls.__init__).parameters if n in choices]
    return [dict(zip(names, combo, strict=True)) for combo in itertools.product(*(choices[n] for n in names))]


def mixer_entries() -> list[tuple[str, Callable[[], nn.Module]]]:
    """(id, build) of every attention layer the models use, with each option."""
    found = []
    for name, cls in infvit.MIXERS.items():
        for options in _options(cls):
            label = ",".join(f"{k}={v}" for k, v in options.items())
            found.append((f"{name}({label})", lambda c=cls, o=options: c(WIDTH, num_heads=HEADS, qkv_bias=True, **o)))
    return found


def double_copy(model: nn.Module) -> nn.Module:
    return copy.deepcopy(model).double()
