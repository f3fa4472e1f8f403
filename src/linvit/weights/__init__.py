"""The one place linvit reads weights; every command and ``linvit.load_run`` come here.

- files.py       one file, read safely: .pth/.pt (weights_only) or .safetensors, state-dict wrappers and
                 'module.' unwrapped, the EMA weights chosen, a foreign file named as what it is
- load.py        weights into a model (strict, one-line errors), a classifier into a backbone, the WeightFormer
                 release's checkpoints (load_checkpoint) (a local file as timm's
                 starting weights is models.variants.pretrained_overlay, below this package)
- run_folder.py  what a run folder says: config.json, which weights model.safetensors holds, args.yaml
                 (use_run_folder: `eval --checkpoint RUN` rebuilds the run's model without being told it)
- rebuild.py     models rebuilt so saved weights fit: create_for_checkpoint (linvit.runs.load_run: any run folder)

Hub ids need nothing here: ``hf-hub:ORG/REPO`` names and the PUBLISHED WeightFormer weights
(linvit.models._cfg) load through timm's own pretrained path, in linvit.models.create_model.
"""

from .files import EMA_KEYS, foreign_file_kind, read_file, read_weights, refuse_exported_graph, unwrap_state_dict
from .load import (
    apply_weights,
    check_num_classes,
    load_and_convert,
    load_backbone,
    load_checkpoint,
    load_weights,
)
from .rebuild import create_for_checkpoint, height_width
from .run_folder import (
    INPUT_ARGS,
    MODEL_ARGS,
    check_exists,
    check_run_labels,
    read_run_config,
    run_args,
    run_model_args,
    saved_weights_kind,
    use_run_folder,
)

__all__ = [
    "EMA_KEYS",
    "INPUT_ARGS",
    "MODEL_ARGS",
    "apply_weights",
    "check_exists",
    "check_run_labels",
    "check_num_classes",
    "create_for_checkpoint",
    "foreign_file_kind",
    "height_width",
    "load_and_convert",
    "load_backbone",
    "load_checkpoint",
    "load_weights",
    "read_file",
    "read_run_config",
    "read_weights",
    "refuse_exported_graph",
    "run_args",
    "run_model_args",
    "saved_weights_kind",
    "unwrap_state_dict",
    "use_run_folder",
]
