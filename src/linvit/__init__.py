"""linvit: linear-time global vision backbones (InfSA, Linear-InfSA, Katz-InfSA, WeightFormer) in timm.

``import linvit`` registers every model with timm, so ``timm.create_model("linear_infvit_4l_patch16_224")``
works; ``linvit.create_model`` is timm's plus linvit's ``:variant`` suffix (``vit_4l_patch16_224:naive``), and
``linvit.list_models`` lists linvit's families. ``linvit.convert(model, variant)``
puts InfSA into an existing timm / torchvision / Hugging Face model (linvit.conversion); ``linvit.load_run(RUN)``
reloads any run folder (classification, segmentation, detection, distillation); ``linvit.distill`` linearizes a
pretrained softmax model (vision or language) by distillation; ``linvit.register_mixer(name, cls)`` adds a token
mixer that each of these then takes by name (``linvit.list_mixers()``: linvit.mixers); ``linvit.load_image`` and
``linvit.predict`` run a model on your own pictures (``linvit predict`` on the command line).
"""

from timm import list_models as _timm_list_models

from . import layers, models, ops
from .conversion import convert, convert_report
from .mixers import get_mixer, list_mixers, register_mixer, registered_mixer, unregister_mixer
from .models.variants import create_model
from .prediction import load_image, predict
from .runs import load_run

__version__ = "0.1.0"

LINVIT_MODEL_MODULES = ("linvit.models.infvit", "linvit.models.weightformer")


def list_models(filter: str = "", **kwargs) -> list[str]:
    """Names of linvit's registered models (timm's list_models restricted to linvit's modules)."""
    import timm.models

    ours = set()
    for mod in LINVIT_MODEL_MODULES:
        ours |= set(timm.models.list_models(module=mod.rsplit(".", 1)[-1]))
    return sorted(n for n in _timm_list_models(filter or "*", **kwargs) if n in ours)


__all__ = [
    "create_model",
    "list_models",
    "load_run",
    "load_image",
    "predict",
    "explain",
    "distill",
    "convert",
    "convert_report",
    "register_mixer",
    "unregister_mixer",
    "registered_mixer",
    "list_mixers",
    "get_mixer",
    "ops",
    "layers",
    "models",
    "__version__",
]


def __getattr__(name: str):
    """``linvit.explain`` and ``linvit.distill`` without importing them (and matplotlib, scikit-learn, the
    trainer) on ``import linvit``; ``linvit.inference``, the deprecated name of linvit.prediction."""
    if name == "explain":
        import importlib

        return importlib.import_module(".explain", __name__)
    if name == "inference":  # linvit.inference.find_images, as the docs once showed: linvit.prediction now
        import importlib

        return importlib.import_module(".inference", __name__)
    if name == "distill":  # the training machinery loads only when distilling
        from .distillation import distill

        return distill
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
