"""The one registry of token mixers: every tool (InfViT and DiT's ``mixer=``, ``linvit.convert``, ``linvit distill``,
explain's maps, the command line's choices, the conformance matrix) reads it, so a new mixer is one module.

A layer that follows timm's ``Attention`` constructor (``dim, num_heads, qkv_bias, qk_norm, proj_bias, attn_drop,
proj_drop, norm_layer``) and parameter layout (``qkv``, ``q_norm``, ``k_norm``, ``norm``, ``proj``) needs nothing
more than ``register_mixer(name, cls)``; the record's other fields say what it adds (a discount, an option after
a colon) or cannot do. Like timm's ``register_model``, registering is a side effect of importing the mixer's
module; ``import linvit`` registers the built-in ones.
"""

from __future__ import annotations

import contextlib
import inspect
import warnings
from collections.abc import Iterator
from dataclasses import dataclass

from timm.layers import Attention

from .errors import UsageError

# what a mixer may declare it cannot do (Mixer.cannot):
#   "convert"    linvit.convert does not put it in (softmax: it is what convert replaces)
#   "attn_drop"  it never forms the attention matrix, so attention dropout must be 0
#   "attn_mask"  it refuses attention masks (one summary for every query)
LIMITS = ("convert", "attn_drop", "attn_mask")


@dataclass(frozen=True)
class Option:
    """The one choice a mixer takes after a colon in convert's and distill's spelling (``katz_infsa:hedgehog``):
    the layer's constructor argument, its values and its default."""

    name: str
    choices: tuple
    default: str


@dataclass(frozen=True)
class Mixer:
    """One registered mixer: its one spelling, its layer class and what the tools need to know of it."""

    name: str
    cls: type
    option: Option | None = None
    cannot: tuple[str, ...] = ()
    maps: tuple[str, ...] = ()  # explain's methods that read this layer's own operator (linvit.explain.maps)
    causal: bool = False  # it has a causal form for language models (linvit.conversion.language)
    distill_gamma: float = 0.9  # linvit distill's first discount when none is given
    aliases: tuple[str, ...] = ()  # earlier spellings, accepted with a DeprecationWarning

    @property
    def discount(self) -> bool:
        """The layer learns a per-head discount (its constructor takes gamma_init)."""
        return self.takes("gamma_init")

    def takes(self, argument: str) -> bool:
        """The layer's constructor takes the argument, itself or through **kwargs to a base class's."""
        for klass in self.cls.__mro__:
            if "__init__" in vars(klass):
                params = inspect.signature(klass.__init__).parameters
                if argument in params:
                    return True
                if not any(p.kind is p.VAR_KEYWORD for p in params.values()):
                    return False
        return False

    def forms(self) -> tuple[str, ...]:
        """Its spellings for convert and distill: the name, then name:value for each non-default option value."""
        if self.option is None:
            return (self.name,)
        others = [f"{self.name}:{v}" for v in self.option.choices if v != self.option.default]
        return (self.name, *others)


_REGISTRY: dict[str, Mixer] = {}
_ALIASES: dict[str, str] = {}


def register_mixer(name: str, cls: type | None = None, **fields):
    """Register the layer class ``cls`` as mixer ``name`` (fields: Mixer's); ``@register_mixer(name)`` on a class
    does the same. A name (or earlier spelling) already registered is an error: unregister_mixer it first."""
    if cls is None:

        def decorate(layer: type) -> type:
            register_mixer(name, layer, **fields)
            return layer

        return decorate
    if not isinstance(cls, type):
        raise UsageError(f"register_mixer({name!r}, ...) takes a layer class, got {cls!r}")
    mixer = Mixer(name, cls, **fields)
    unknown = [c for c in mixer.cannot if c not in LIMITS]
    if unknown:
        raise UsageError(f"mixer {name!r}: unknown limits {unknown}; choose from {', '.join(LIMITS)}")
    taken = [n for n in (name, *mixer.aliases) if n in _REGISTRY or n in _ALIASES]
    if taken or ":" in name:
        why = f"{taken[0]!r} is already registered" if taken else "a name has no ':'"
        raise UsageError(f"cannot register mixer {name!r}: {why}")
    _REGISTRY[name] = mixer
    _ALIASES.update(dict.fromkeys(mixer.aliases, name))
    return mixer


def unregister_mixer(name: str) -> Mixer:
    """Remove mixer ``name`` (and its earlier spellings) from the registry; returns its record."""
    mixer = get_mixer(name, warn=False)
    del _REGISTRY[mixer.name]
    for alias in mixer.aliases:
        _ALIASES.pop(alias, None)
    return mixer


@contextlib.contextmanager
def registered_mixer(name: str, cls: type, **fields) -> Iterator[Mixer]:
    """register_mixer for the duration of a with block (tests, experiments)."""
    mixer = register_mixer(name, cls, **fields)
    try:
        yield mixer
    finally:
        unregister_mixer(name)


def list_mixers(convertible: bool = False) -> list[str]:
    """The registered mixers' names in registration order; convertible: only those linvit.convert puts in."""
    return [n for n, m in _REGISTRY.items() if not (convertible and "convert" in m.cannot)]


def get_mixer(name: str, warn: bool = True) -> Mixer:
    """The record of mixer ``name``; an earlier spelling ('katz') gives its mixer with a DeprecationWarning."""
    if name in _ALIASES:
        new = _ALIASES[name]
        if warn:
            warnings.warn(f"mixer {name!r} is deprecated, use {new!r}", DeprecationWarning, stacklevel=3)
        name = new
    if name not in _REGISTRY:
        raise UsageError(f"unknown mixer {name!r}; choose from {', '.join(_REGISTRY)}")
    return _REGISTRY[name]


def mixer_of(module: object) -> Mixer | None:
    """The record of the nearest registered class in type(module)'s bases (None: not a registered mixer)."""
    by_class = {m.cls: m for m in _REGISTRY.values()}
    return next((by_class[c] for c in type(module).__mro__ if c in by_class), None)


def conversion_forms() -> tuple[str, ...]:
    """Every spelling linvit.convert and linvit distill take (each convertible mixer and its options)."""
    names = list_mixers(convertible=True)
    mixers = [_REGISTRY[n] for n in names]
    return tuple(names) + tuple(f for m in mixers for f in m.forms()[1:])


register_mixer("softmax", Attention, cannot=("convert",), maps=("cls", "rollout"))  # timm's: the baseline
