"""What a conversion records: its report (ConversionReport) and, on a timm model, how to rebuild it (mark_converted).

A leaf module: core, language and timm_model all import it, and it imports none of them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch.nn as nn

ARCHITECTURE = "infsa_converted"  # the timm architecture a converted timm model is rebuilt by (timm_model)


@dataclass
class ConvertedModule:
    name: str
    source: str  # the source class, e.g. "timm.layers.attention.Attention"
    heads: int
    width: int


@dataclass
class SkippedModule:
    name: str
    source: str
    reason: str


@dataclass
class ConversionReport:
    """What convert() did: its arguments, every module converted and every attention-like module skipped."""

    variant: str
    gamma_init: float
    include: list[str] | None
    exclude: list[str] | None
    converted: list[ConvertedModule] = field(default_factory=list)
    skipped: list[SkippedModule] = field(default_factory=list)
    window: int | None = None  # causal language models: exact softmax over the last window tokens (hybrid)

    def to_dict(self) -> dict:
        return asdict(self)

    def __str__(self) -> str:
        from ..mixers import get_mixer

        discount = get_mixer(self.variant.partition(":")[0], warn=False).discount  # linear attention has none to say
        settings = ([f"gamma_init {self.gamma_init}"] if discount else []) + (
            [f"window {self.window}"] if self.window is not None else []
        )
        said = f" ({', '.join(settings)})" if settings else ""
        lines = [f"converted {len(self.converted)} attention layers to {self.variant}{said}"]
        lines += [f"  {c.name}: {c.source}, {c.heads} heads, width {c.width}" for c in self.converted]
        if self.skipped:
            lines.append(f"skipped {len(self.skipped)}:")
            lines += [f"  {s.name}: {s.source} ({s.reason})" for s in self.skipped]
        return "\n".join(lines)


def mark_converted(
    model: nn.Module,
    variant: str,
    gamma_init: float,
    include,
    exclude,
    linear_variant: str = "release",
    feature_dim: int | None = None,
) -> None:
    """Record on a timm model how to rebuild it converted (a no-op for models timm did not create)."""
    cfg = getattr(model, "pretrained_cfg", None)
    if not isinstance(cfg, dict) or "architecture" not in cfg:
        return
    args = dict(getattr(model, "_model_args", {}))
    source = args.get("source_model", cfg["architecture"])  # converting a converted model keeps the source
    args.update(source_model=source, convert_variant=variant, gamma_init=gamma_init, include=include, exclude=exclude)
    args.pop("linear_variant", None)
    if linear_variant != "release":  # only then: configs of release-form conversions stay as they were
        args["linear_variant"] = linear_variant
    args.pop("feature_dim", None)
    if feature_dim is not None:
        args["feature_dim"] = feature_dim
    model._model_args = args
    model.pretrained_cfg = {**cfg, "architecture": ARCHITECTURE}
