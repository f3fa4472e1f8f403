"""Image classification with the DeiT recipe on ImageNet-layout folders (`linvit train`), a Task on the one trainer.

Built from timm's pieces: create_transform (RandAugment, random erasing), Mixup/CutMix with
SoftTargetCrossEntropy, create_optimizer_v2 (no weight decay on norms, biases, position embeddings
and InfSA discounts), a per-iteration cosine schedule with warm-up, ModelEmaV3. config.py: ClassifyConfig and
--model-kwargs; data.py: the transforms, splits and Mixup targets; engine.py: the Task and its Metric.
"""

from .config import ClassifyConfig, with_model_kwargs
from .data import build_datasets, mixup_and_criterion
from .engine import Classification, ClassificationScores, evaluate_classification, run_train

__all__ = [
    "ClassifyConfig",
    "run_train",
    "Classification",
    "ClassificationScores",
    "evaluate_classification",
    "with_model_kwargs",
    "build_datasets",
    "mixup_and_criterion",
]
