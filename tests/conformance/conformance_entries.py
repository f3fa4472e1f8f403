"""What the conformance matrix checks: every model linvit registers, found at collection time, never listed.

- classifiers: every name of `linvit.list_models()` (timm's registry filtered to linvit's modules), with every
  ':variant' suffix that applies to it (models.variants.VARIANTS) and, one at a time, every value beyond the
  default of each choice-valued option of its constructor (read from the signature: see `literal_options`),
  built tiny (2 blocks, width 32);
- DiT: one per mixer of `linvit.models.dit.dit_mixers()` (the mixer registry's and WeightFormer's block);
- distillation students: a tiny softmax ViT converted to each of `linvit.convert`'s forms (linvit.distill;
  conversion.FORMS: every variant and each of its options, e.g. `katz_infsa:hedgehog`);
- language models: GPT-2, Llama, Qwen3 and Mistral on tiny random configs, converted by `linvit.convert` to
  every form a causal model accepts (pure InfSA, causal Katz-InfSA and its learned feature map; each that takes
  a sliding window also with window=4, `+window4`), fed
  LM_TOKENS tokens: more than two of causal Katz's 64-token chunks;
- mixers: every layer of the mixer registry (`linvit.list_mixers()`) with every combination of its options.

A choice-valued option is a parameter typed with a `typing.Literal` (layers.infsa_attention.PureImpl, FoldKV,
ops.infsa.LinearVariant, layers.feature_maps.FeatureMap), the one list its values are validated against, so a
new family, variant, DiT mixer, option or option value is enrolled without editing this file. Tiny builds
that come out identical (infvit_tiny and infvit_small at width 32: the same modules, parameter shapes and
switches; an option its model has no layer for, or a variant that is the default) are checked once.
"""

from __future__ import annotations

import copy
import functools
import inspect
import itertools
import typing
from collections.abc import Callable
from dataclasses import dataclass, field

import timm
import torch
import torch.nn as nn

import linvit
from linvit.errors import UsageError
from linvit.models import dit as dit_models
from linvit.models.variants import VARIANTS, apply_variant

WIDTH, HEADS, IMAGE = 32, 2, 64  # 16 tokens at patch 16: WeightFormer takes multiples of 32 px
LM_VOCAB, LM_TOKENS, LM_POSITIONS = 61, 150, 256  # 150 tokens: three of causal Katz's 64-token chunks
LM_FAMILIES = ("gpt2", "Llama", "Qwen3", "Mistral")


@dataclass(frozen=True)
class Entry:
    """One model of the matrix: how to build it (seeded) and feed it a batch."""

    id: str
    kind: str  # "classifier", "dit" or "lm"
    build: Callable[[], nn.Module] = field(compare=False)
    inputs: Callable[[int, torch.dtype, int], tuple] = field(compare=False)  # (batch, float dtype, seed)
    size_arg: bool = False  # inputs take an image size (H, W): the size checks apply
    compiled: bool = True  # the torch.compile check runs (see lm_entries)
    fullgraph: bool = True  # ... and compiles the model in one graph

    def model(self) -> nn.Module:
        torch.manual_seed(0)
        return self.build().eval()


def output_tensor(out) -> torch.Tensor:
    """The tensor a model returns: logits for transformers' outputs, the tensor itself otherwise."""
    return out.logits if hasattr(out, "logits") else out


def _images(batch: int, dtype: torch.dtype, seed: int, size: tuple[int, int] = (IMAGE, IMAGE)) -> tuple:
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(batch, 3, *size, generator=gen).to(dtype),)


@functools.cache
def literal_options(cls: type) -> dict[str, tuple[tuple, object]]:
    """{name: (values, default)} of each parameter of cls.__init__ typed with a Literal (or an optional one)."""
    try:
        hints = typing.get_type_hints(cls.__init__)
    except Exception:  # a class outside linvit whose annotations do not resolve: it declares no options
        return {}
    found = {}
    for name, param in inspect.signature(cls.__init__).parameters.items():
        hint = hints.get(name)
        literal = next((h for h in (hint, *typing.get_args(hint)) if typing.get_origin(h) is typing.Literal), None)
        if literal is not None:
            found[name] = (typing.get_args(literal), param.default)
    return found


def _settings(model: nn.Module) -> list:
    """Every module's switches, the kinds of value an option takes (impl, fold_kv, fused_attn, ...): two builds
    with equal repr, parameter shapes and switches run the same code."""
    return [(p, k, v) for p, m in model.named_modules() for k, v in vars(m).items() if isinstance(v, (bool, str))]


def _classifier(name: str, variant: str | None, options: dict | None = None) -> nn.Module:
    kwargs = dict(depth=2, embed_dim=WIDTH, num_classes=5, **(options or {}))
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


def _model_options(name: str) -> list[dict]:
    """One {option: value} per value beyond the default of each Literal-typed option of the model's class."""
    choices = literal_options(type(_classifier(name, None)))
    return [{k: v} for k, (values, default) in choices.items() for v in values if v != default]


def classifier_entries() -> list[Entry]:
    found: dict[str, Entry] = {}
    for name in linvit.list_models():
        builds = [(v, None) for v in (None, *VARIANTS)] + [(None, o) for o in _model_options(name)]
        for variant, options in builds:
            if variant is not None and not _variant_applies(name, variant):
                continue
            model = _classifier(name, variant, options)
            shapes = [(k, tuple(v.shape)) for k, v in model.state_dict().items()]  # img_size shows in pos_embed
            key = f"{model!r}|{shapes}|{_settings(model)}"
            spec = name if variant is None else f"{name}:{variant}"
            spec += "".join(f"({k}={v})" for k, v in (options or {}).items())
            build = functools.partial(_classifier, name, variant, options)
            found.setdefault(key, Entry(spec, "classifier", build, _images, size_arg=True))
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

    return [Entry(f"dit:{m}", "dit", lambda m=m: build(m), _dit_inputs) for m in dit_models.dit_mixers()]


def _lm_inputs(batch: int, dtype: torch.dtype, seed: int) -> tuple:
    gen = torch.Generator().manual_seed(seed)
    return (torch.randint(1, LM_VOCAB, (batch, LM_TOKENS), generator=gen),)


def _lm(family: str, variant: str) -> nn.Module:
    import transformers

    if family == "gpt2":
        source = transformers.GPT2LMHeadModel(
            transformers.GPT2Config(vocab_size=LM_VOCAB, n_embd=WIDTH, n_layer=2, n_head=4, n_positions=LM_POSITIONS)
        )
    else:
        shape = dict(vocab_size=LM_VOCAB, hidden_size=WIDTH, intermediate_size=64, num_attention_heads=4)
        extra = {"Qwen3": dict(num_key_value_heads=1, head_dim=8), "Mistral": dict(sliding_window=32)}
        config = getattr(transformers, f"{family}Config")(
            **shape,
            num_hidden_layers=2,
            max_position_embeddings=LM_POSITIONS,
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


def _lm_entry(family: str, form: str, compiled: bool) -> Entry:
    """Only pure InfSA compiles in one graph: causal Katz and linear attention read the mask's values (to
    refuse, in one line, a pattern their state cannot follow, and to reset where a packed document starts),
    and dynamo breaks the graph at such a data-dependent branch."""
    build = functools.partial(_lm, family, form)
    return Entry(f"lm:{family}:{form}", "lm", build, _lm_inputs, compiled=compiled, fullgraph=form == "pure_infsa")


def lm_entries() -> list[Entry]:
    """Every family under every form. torch.compile (7-10 s of CPU each where the graph breaks) runs on one
    family per form, the families in turn, so each form and each family is compiled at least once."""
    try:
        import transformers  # noqa: F401
    except ImportError:
        return []
    forms, families = _causal_forms(), LM_FAMILIES
    return [
        _lm_entry(f, v, compiled=i % len(families) == j) for i, v in enumerate(forms) for j, f in enumerate(families)
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
    """Every combination of a mixer layer's choice-valued options (its Literal-typed parameters)."""
    choices = literal_options(cls)
    return [dict(zip(choices, combo, strict=True)) for combo in itertools.product(*(v for v, _ in choices.values()))]


def mixer_entries() -> list[tuple[str, Callable[[], nn.Module]]]:
    """(id, build) of every attention layer the models use, with each option."""
    found = []
    for name in linvit.list_mixers():
        cls = linvit.get_mixer(name).cls
        for options in _options(cls):
            label = ",".join(f"{k}={v}" for k, v in options.items())
            found.append((f"{name}({label})", lambda c=cls, o=options: c(WIDTH, num_heads=HEADS, qkv_bias=True, **o)))
    return found


def double_copy(model: nn.Module) -> nn.Module:
    return copy.deepcopy(model).double()
