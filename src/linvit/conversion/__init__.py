"""Put InfSA into models people already have: ``linvit.convert(model, "linear_infsa")``.

Converts timm ``Attention`` (ViT, DeiT, ...), ``torch.nn.MultiheadAttention`` (torchvision ViTs,
``nn.TransformerEncoder``) and Hugging Face ViT / DeiT / DINOv2 attention in place, keeping the pretrained
projections; other attention classes convert through ``target_types`` and a small adapter
(linvit.conversion.adapters). Masks reaching a converted layer are honoured by pure InfSA and refused by
Linear- and Katz-InfSA; a causal language model converts to pure or causal Katz-InfSA
(linvit.conversion.language, language_katz). See docs/conversion.md.
"""

from . import core
from .adapters import AttentionWeights, UnmappableAttention
from .core import ConversionReport, convert, convert_if_asked, convert_report
from .timm_model import infsa_converted

__all__ = [
    "convert",
    "convert_report",
    "convert_if_asked",
    "ConversionReport",
    "AttentionWeights",
    "UnmappableAttention",
    "VARIANTS",
    "FORMS",
    "infsa_converted",
]


def __getattr__(name: str):
    """VARIANTS (the mixers convert puts in) and FORMS (their spellings with options), read from the mixer
    registry when asked (linvit.mixers), so a mixer registered later is in them."""
    if name in ("VARIANTS", "FORMS"):
        return getattr(core, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
