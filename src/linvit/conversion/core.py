"""``linvit.convert``: replace a model's softmax attention layers by InfSA layers, keeping their weights.

Every attention module an adapter recognises is checked and its replacement built before any is swapped
in, so a model is converted completely or not at all. The report of what was converted and what was
skipped (and why) is returned by ``convert_report(model)``.
"""

from __future__ import annotations

import copy
import numbers
import re
import warnings
from collections.abc import Iterable, Mapping, Sequence

import torch
import torch.nn as nn
from timm.layers import trunc_normal_

from ..errors import UsageError
from ..layers.feature_maps import LEARNED_FEATURE_MAPS
from ..layers.infsa_attention import LINEAR_VARIANTS, check_choice, check_feature_map, check_gamma_init
from ..mixers import Mixer, conversion_forms, get_mixer, list_mixers, mixer_of
from .adapters import AttentionWeights, UnmappableAttention, adapter_for, builtin_adapters
from .language import convert_language_model, interface_attention_modules
from .records import ConversionReport, ConvertedModule, SkippedModule, mark_converted


def __getattr__(name: str):
    """The earlier module-level lists, read from the mixer registry as it is now (linvit.mixers)."""
    if name == "VARIANTS":
        return tuple(list_mixers(convertible=True))
    if name == "FORMS":
        return conversion_forms()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def parse_variant(spec: str) -> tuple[str, dict[str, str]]:
    """'variant[:option]' -> (variant, {option's name: value}) with the option only when it is not the default;
    one-line errors for an unknown one."""
    variant, sep, option = spec.partition(":")
    mixer = _convertible(variant)
    if not sep:
        return mixer.name, {}
    if mixer.option is None:
        raise UsageError(f"{mixer.name} takes no ':option'; got {spec!r}")
    name, choices, default = mixer.option.name, mixer.option.choices, mixer.option.default
    check_choice(f"{mixer.name}'s {name}", option, choices)
    return mixer.name, {} if option == default else {name: option}


def _convertible(variant: str) -> Mixer:
    """The registered mixer convert puts in for variant, by its one spelling (convert never took the old 'katz');
    one line for an unknown one or softmax."""
    if variant not in list_mixers(convertible=True):
        raise UsageError(f"unknown variant {variant!r}; choose from {', '.join(conversion_forms())}")
    return get_mixer(variant)


def canonical_form(spec: str) -> str:
    """The FORMS spelling of spec ("katz_infsa:relu" -> "katz_infsa"), one-line errors for an unknown one."""
    variant, options = parse_variant(spec)
    return f"{variant}:{next(iter(options.values()))}" if options else variant


def _qualname(module: nn.Module) -> str:
    cls = type(module)
    return f"{cls.__module__}.{cls.__qualname__}"


def _patterns(value: str | Sequence[str] | None) -> list[str] | None:
    if value is None:
        return None
    patterns = [value] if isinstance(value, str) else list(value)
    for p in patterns:
        try:
            re.compile(p)
        except re.error as err:
            raise UsageError(f"invalid name pattern {p!r}: {err}") from err
    return patterns


def _selected(name: str, include: list[str] | None, exclude: list[str] | None) -> str | None:
    """None if the module name passes include/exclude (re.search), else the reason it does not."""
    if include is not None and not any(re.search(p, name) for p in include):
        return "not matched by include"
    if exclude is not None and any(re.search(p, name) for p in exclude):
        return "matched by exclude"
    return None


def _looks_like_attention(module: nn.Module) -> bool:
    return "attention" in type(module).__name__.lower() or isinstance(module, nn.MultiheadAttention)


def _weights_of(adapter, module: nn.Module) -> AttentionWeights:
    extract = adapter.weights if hasattr(adapter, "weights") else adapter
    return extract(module)


def build_layer(
    variant: str,
    w: AttentionWeights,
    gamma_init: float,
    copy_weights: bool,
    options: Mapping[str, str] | None = None,
    feature_dim: int | None = None,
) -> nn.Module:
    """The registered mixer's layer for one source attention, built with timm Attention's arguments (plus its
    discount, its ':option' from options or the default, and feature_dim where it takes them); its weights are
    the source's values (copied)."""
    mixer = get_mixer(variant, warn=False)
    ref = w.qkv_weight
    extra = {"gamma_init": gamma_init} if mixer.discount else {}
    if mixer.option is not None:
        extra[mixer.option.name] = (options or {}).get(mixer.option.name) or mixer.option.default
    if mixer.takes("feature_dim"):
        extra["feature_dim"] = feature_dim
    layer = mixer.cls(
        w.dim,
        w.num_heads,
        qkv_bias=w.qkv_bias is not None,
        proj_bias=w.proj_bias is not None,
        attn_drop=0.0 if "attn_drop" in mixer.cannot else w.attn_drop,  # it never forms the attention matrix
        proj_drop=w.proj_drop,
        device=ref.device,
        dtype=ref.dtype,
        **extra,
    )
    for norm_name in ("q_norm", "k_norm", "norm"):
        norm = getattr(w, norm_name)
        if norm is not None:
            norm = copy.deepcopy(norm)
            if not copy_weights and hasattr(norm, "reset_parameters"):
                norm.reset_parameters()
            setattr(layer, norm_name, norm)
    with torch.no_grad():
        pairs = [(layer.qkv.weight, w.qkv_weight), (layer.proj.weight, w.proj_weight)]
        pairs += [(layer.qkv.bias, w.qkv_bias), (layer.proj.bias, w.proj_bias)]
        for target, source in pairs:
            if source is None:
                continue
            if copy_weights:
                target.copy_(source)
            elif target.dim() > 1:
                trunc_normal_(target, std=0.02)  # timm's ViT initialisation
            else:
                target.zero_()
    return layer


def _set_submodule(model: nn.Module, name: str, module: nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent_name) if parent_name else model, child, module)


DEFAULT_GAMMA = 0.9  # convert's first discount where none is given (distill starts Katz at 0.5: its own default)


def convert(
    model: nn.Module,
    variant: str = "linear_infsa",
    *,
    gamma_init: float | None = None,
    include: str | Sequence[str] | None = None,
    exclude: str | Sequence[str] | None = None,
    target_types: Mapping[type, object] | Iterable[type] | None = None,
    copy_weights: bool = True,
    linear_variant: str = "release",
    feature_dim: int | None = None,
    window: int | None = None,
) -> nn.Module:
    """Convert the model's attention layers to InfSA in place and return the model.

    Args:
        model: any nn.Module holding timm ``Attention``, ``torch.nn.MultiheadAttention`` or Hugging Face
            ViT / DeiT / DINOv2 attention modules; or a transformers language model (GPT-2, Llama, Qwen3,
            BERT, ...), which selects pure or causal Katz-InfSA through transformers' attention interface
            (linvit.conversion.language, language_katz; Linear-InfSA refuses causal models).
        variant: "linear_infsa" (O(N), the paper's Linear-InfSA), "pure_infsa" (one normalised hop, honours
            masks) or "katz_infsa" (linvit's exact infinite-hop series in O(N)), with an optional option
            after a colon (FORMS): "katz_infsa:hedgehog" learns a feature map per head (layers.feature_maps;
            "katz_infsa:elu+1" a fixed one), "linear_infsa:softplus" a stabilised score map.
        gamma_init: initial discount of every head, in (0, 1); it trains (gamma = sigmoid(theta)). None: 0.9,
            and a converted language model converted again keeps the discounts its layers have.
        include, exclude: regular expressions searched in module names (``model.named_modules()``);
            a module converts if it matches an include pattern (all do without include) and no exclude one.
        target_types: a mapping {module type: adapter} adding (or overriding) adapters for other attention
            classes (see linvit.conversion.adapters), or a list of types restricting the conversion to them.
        copy_weights: carry the q/k/v/output projections (and q/k norms) over; False re-initialises them.
        linear_variant: Linear-InfSA's score map ("release", or a stabilised form: docs/spec/infsa.md 3.1);
            the same as "linear_infsa:NAME".
        feature_dim: a learned feature map's size f (2 f features per head; default the head dim).
        window: causal language models under katz_infsa or linear_attention (any feature map): exact softmax
            over the last ``window`` tokens, the form over every older one, one normaliser (ops.window_causal;
            docs/spec/infsa.md 4.2). Converting again with another window applies it; None: no window.

    Raises:
        ValueError naming the module when a recognised attention cannot be converted (unknown heads,
        cross-attention, unmappable weights); the model is then left unchanged.
    """
    base, options = parse_variant(variant)
    variant = canonical_form(variant)
    given, gamma_init = gamma_init is not None, DEFAULT_GAMMA if gamma_init is None else gamma_init
    if get_mixer(base, warn=False).discount:
        gamma_init = check_gamma_init(gamma_init)
    elif not (isinstance(gamma_init, numbers.Real) and gamma_init == DEFAULT_GAMMA):  # never read: said, not checked
        warnings.warn(f"gamma_init={gamma_init!r} is ignored: {base} has no discount", stacklevel=2)
        gamma_init = DEFAULT_GAMMA  # what the report and a reloaded model's config then record
    check_choice("linear_variant", linear_variant, LINEAR_VARIANTS)
    option = get_mixer(base, warn=False).option
    if linear_variant != "release" and (option is None or option.name != "linear_variant"):
        warnings.warn(
            f"linear_variant={linear_variant!r} is ignored: it is linear_infsa's option, not {base}'s", stacklevel=2
        )
        linear_variant = "release"  # what the report and a reloaded model's config then record
    if options.get("linear_variant", linear_variant) != linear_variant and linear_variant != "release":
        raise UsageError(f"variant {variant!r} and linear_variant={linear_variant!r} disagree: give one")
    linear_variant = options.get("linear_variant", linear_variant)
    if linear_variant != "release" and "linear_variant" not in options:  # the report names the form that runs
        variant = canonical_form(f"{base}:{linear_variant}")
    feature_map = options.get("feature_map")  # None: the variant's own (ReLU; ELU + 1 in causal language models)
    if feature_dim is not None and feature_map not in LEARNED_FEATURE_MAPS:
        learned = ", ".join(f for f in conversion_forms() if f.partition(":")[2] in LEARNED_FEATURE_MAPS)
        raise UsageError(f"feature_dim sizes a learned feature map ({learned}); {variant!r} has none")
    check_feature_map(feature_map or "relu", feature_dim)
    check_window(window)
    include, exclude = _patterns(include), _patterns(exclude)
    adapters = _chosen_adapters(target_types)
    report = ConversionReport(variant, gamma_init, include, exclude, window=window)
    language = _language_model_layers(model, adapters, include, exclude, report)
    if language:
        model = convert_language_model(model, base, gamma_init, language, report, feature_map, feature_dim, window)
        if given and report.gamma_init != gamma_init:  # converted before: its layers kept their discounts
            warnings.warn(
                f"gamma_init={gamma_init} sets no discount: the layers converted before keep theirs (first "
                f"gamma_init {report.gamma_init}); convert the softmax original to start them at {gamma_init}",
                stacklevel=2,
            )
        model.linvit_conversion = report
        return model
    if window is not None:
        raise UsageError(
            f"window= is for causal language models: {type(model).__name__} is not a causal language model"
        )

    chosen = {**options, "linear_variant": linear_variant}  # convert's linear_variant= is linear_infsa's option

    def build(weights: AttentionWeights) -> nn.Module:
        return build_layer(base, weights, gamma_init, copy_weights, chosen, feature_dim)

    plan = _replacements(model, adapters, include, exclude, build, report)
    if plan[0][0] == "":
        model = plan[0][1]  # the model is itself one attention module
    else:
        for name, replacement in plan:
            _set_submodule(model, name, replacement)
    _disable_fused_encoders(model)
    shown = {k: v for k, v in options.items() if k != "linear_variant"}  # linear_variant is recorded on its own
    record = f"{base}:{next(iter(shown.values()))}" if shown else base
    mark_converted(model, record, gamma_init, include, exclude, linear_variant, feature_dim)  # timm reloads it
    model.linvit_conversion = report
    return model


def check_window(window) -> None:
    """window is None or a positive whole number of tokens (one line otherwise)."""
    if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
        raise UsageError(f"window must be a positive whole number of tokens, got {window!r}")


def _chosen_adapters(target_types) -> dict:
    """The built-in adapters, extended by a {type: adapter} mapping or restricted to a list of types."""
    adapters = builtin_adapters()
    if isinstance(target_types, Mapping):
        adapters.update(target_types)
    elif target_types is not None:
        wanted = tuple(target_types)
        missing = [t.__name__ for t in wanted if adapter_for(t, adapters) is None]
        if missing:
            raise UsageError(f"no adapter for {missing}; pass target_types as a mapping {{type: adapter}}")
        adapters = {t: adapter_for(t, adapters) for t in wanted}
    return adapters


def _replacements(model, adapters, include, exclude, build, report) -> list[tuple[str, nn.Module]]:
    """(module name, its InfSA replacement) for every selected attention module, outermost first; the rest are
    recorded in the report as skipped. Raises before anything is replaced, so a failed conversion changes nothing."""
    plan: list[tuple[str, nn.Module]] = []
    inside: list[str] = []  # prefixes of modules already handled: their children are not attention layers
    for name, module in model.named_modules():
        if any(name.startswith(p + ".") for p in inside):
            continue
        if mixer_of(module) is not None and "convert" not in mixer_of(module).cannot:
            inside.append(name)
            if name:
                report.skipped.append(SkippedModule(name, _qualname(module), "already InfSA"))
            continue
        adapter = adapter_for(type(module), adapters)
        if adapter is None:
            if _looks_like_attention(module) and name:
                report.skipped.append(SkippedModule(name, _qualname(module), "no adapter for this type (target_types)"))
            continue
        inside.append(name)
        reason = _selected(name, include, exclude)
        if reason:
            report.skipped.append(SkippedModule(name, _qualname(module), reason))
            continue
        label = name or type(module).__name__
        try:
            weights = _weights_of(adapter, module)
            weights.check(label)
            layer = build(weights)
        except UnmappableAttention as err:
            message = str(err) if str(err).startswith(label + ":") else f"{label}: {err}"
            raise UsageError(f"cannot convert {message}") from err
        replacement = adapter.wrap(layer, module, label) if hasattr(adapter, "wrap") else layer
        plan.append((name, replacement))
        report.converted.append(ConvertedModule(label, _qualname(module), weights.num_heads, weights.dim))
    if not plan:
        raise UsageError(f"no attention layer to convert in {type(model).__name__}:\n{report}")
    return plan


def _language_model_layers(model, adapters, include, exclude, report) -> list[tuple[str, nn.Module]]:
    """A transformers model whose attention calls the attention interface (and holds no layer an adapter
    replaces): its selected attention layers, the skipped ones added to the report; [] for any other model."""
    modules = interface_attention_modules(model)
    if not modules or any(adapter_for(type(m), adapters) is not None for m in model.modules()):
        return []
    selected = []
    for name, module in modules:
        reason = _selected(name, include, exclude)
        if reason:
            report.skipped.append(SkippedModule(name, _qualname(module), reason))
        else:
            selected.append((name, module))
    if not selected:
        raise UsageError(f"no attention layer to convert in {type(model).__name__}:\n{report}")
    return selected


def _disable_fused_encoders(model: nn.Module) -> None:
    """nn.TransformerEncoder's nested-tensor fast path calls fused softmax kernels on self_attn's weights."""
    for m in model.modules():
        if isinstance(m, nn.TransformerEncoder):
            if any(not isinstance(layer.self_attn, nn.MultiheadAttention) for layer in m.layers):
                m.use_nested_tensor = False


def convert_if_asked(
    model: nn.Module, variant: str | None, gamma_init: float = 0.9, feature_dim: int | None = None, window=None
) -> dict | None:
    """The commands' --convert: convert in place when a variant is given; the report as a dict for the run's
    metadata (None when nothing was asked). The model must hold its attention layers below the top level."""
    if variant is None:
        return None
    converted = convert(model, variant, gamma_init=gamma_init, feature_dim=feature_dim, window=window)
    report = convert_report(converted)  # "katz_infsa:hedgehog" and the like
    return report.to_dict()


def convert_report(model: nn.Module) -> ConversionReport:
    """The report convert() attached to the model (raises ValueError if it was not converted)."""
    report = getattr(model, "linvit_conversion", None)
    if report is None:
        raise UsageError(f"{type(model).__name__} was not converted with linvit.convert")
    return report
