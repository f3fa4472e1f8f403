"""The one trainer: ``fit(task, config)`` runs any Task (classification, segmentation, detection, generation)
under a typed TrainConfig, on one process or many (torchrun DDP); and the one evaluation loop,
``run_evaluation(model, loader, metric)``, that tasks evaluate through, in training and in their eval commands.

- fit.py: Task, Run, fit and the epoch loop;
- evaluation.py: Metric, run_evaluation and the rank-sharded evaluation loader;
- steps.py: the steps of an epoch (train_pass) and one optimizer step;
- recipe.py: optimizer, schedule, scaler, the training loader, DDP;
- resume.py: checkpoint state back into a run, and which flags may change on resume;
- record.py: what the output folder holds (args.yaml, metrics.jsonl, last.pth, the final model folder);
- health.py: gradient-norm and dead-head numbers of an epoch.
"""

from .evaluation import Metric, eval_loader, run_evaluation
from .fit import Parts, Run, Task, fit
from .health import DeadHeadStats, GradNormStats
from .recipe import train_loader, training_recipe, wrap_ddp
from .record import ARGS, write_run_config
from .resume import CHECKPOINT, METRICS, RUNTIME_FLAGS, SCHEDULE_FLAGS, plan_changes, resume_run, training_state
from .steps import CHECK_EVERY, optimizer_step, stop_if_not_finite, train_pass

__all__ = [
    "ARGS",
    "CHECK_EVERY",
    "CHECKPOINT",
    "METRICS",
    "RUNTIME_FLAGS",
    "SCHEDULE_FLAGS",
    "DeadHeadStats",
    "GradNormStats",
    "Metric",
    "Parts",
    "Run",
    "Task",
    "eval_loader",
    "fit",
    "optimizer_step",
    "plan_changes",
    "resume_run",
    "run_evaluation",
    "stop_if_not_finite",
    "train_loader",
    "train_pass",
    "training_recipe",
    "training_state",
    "wrap_ddp",
    "write_run_config",
]
