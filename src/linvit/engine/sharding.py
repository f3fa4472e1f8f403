"""--strategy ddp|fsdp and --grad-checkpointing: how the one trainer spreads a model over the ranks.

ddp (the default) keeps the whole model, its gradients and its optimizer state on every rank; fsdp shards
parameters, gradients and optimizer state over the ranks with PyTorch's FSDP2 (``fully_shard`` on each block,
then on the root, over a 1-D device mesh), the way torchtitan does. No engine of our own: only where the
blocks are and when to gather them is linvit's.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.nn as nn

from ..errors import UsageError
from ..utils.artifacts import layout_of, write_safetensors

STRATEGIES = ("ddp", "fsdp")
VIEW_WARNING = r"FSDP2-wrapped module \(.*\) returned a view tensor"  # see quiet_view_warnings
SHARD_UNIT = "_linvit_shard_unit"  # a module attribute: shard this module as its own unit (mark_unit)
BLOCK_LISTS = ("blocks", "layers", "h")  # timm's ViTs and stages, HF decoders (model.layers, GPT-2's h)


def check_strategy(config) -> None:
    """One line for what fsdp does not take."""
    if config.strategy not in STRATEGIES:
        raise UsageError(f"--strategy {config.strategy}: choose one of {', '.join(STRATEGIES)}")
    if config.strategy == "fsdp" and config.amp == "fp16":
        raise UsageError("--strategy fsdp takes --amp bf16 or none (fp16 needs a sharded gradient scaler)")
    if config.shard_size is not None and config.strategy != "fsdp":
        raise UsageError(f"--shard-size {config.shard_size} is fsdp's: add --strategy fsdp")


def device_mesh(world: int, device: torch.device, shard_size: int | None = None):
    """All ranks in one shard group (1-D), or with --shard-size S a replicate x shard mesh of world / S groups
    of S ranks (HSDP: sharded within a group, say a node; gradients all-reduced across the groups)."""
    from torch.distributed.device_mesh import init_device_mesh

    if shard_size is None or shard_size == world:
        return init_device_mesh(device.type, (world,))
    if shard_size < 1 or world % shard_size:
        raise UsageError(f"--shard-size {shard_size} must divide the world size {world}")
    return init_device_mesh(device.type, (world // shard_size, shard_size), mesh_dim_names=("replicate", "shard"))


def set_grad_checkpointing(model: nn.Module) -> None:
    """timm's set_grad_checkpointing on the outermost modules that have it (a distiller's student, a
    detector's backbone); a model without it is told in one line."""
    found = [m for m in model.modules() if callable(getattr(m, "set_grad_checkpointing", None))]
    outer = [m for m in found if not any(m is not o and any(s is m for s in o.modules()) for o in found)]
    if not outer:
        raise UsageError(f"--grad-checkpointing: {type(model).__name__} has no set_grad_checkpointing")
    for module in outer:
        module.set_grad_checkpointing(True)


LISTS = (nn.ModuleList, nn.Sequential)


def mark_unit(module: nn.Module) -> None:
    """Shard module as a unit of its own, inside its block: a task whose loss reads the module's output directly
    (distill's attention transfer reads each converted layer's) needs FSDP2's pre-backward hook on that output,
    or backward meets the block's parameters resharded ("setStorage ... out of bounds for storage of size 0")."""
    setattr(module, SHARD_UNIT, True)


def blocks(model: nn.Module) -> list[nn.Module]:
    """The modules fsdp shards one by one, each once, outermost first (shard() wraps them in reverse, so a module
    after the modules inside it): the items of every ModuleList or Sequential named in BLOCK_LISTS (nested ones
    included: a hierarchical model's stages and their blocks) and the modules mark_unit flagged."""
    lists = {id(m) for n, m in model.named_modules() if n.rsplit(".", 1)[-1] in BLOCK_LISTS and isinstance(m, LISTS)}
    depth: dict[int, tuple[int, nn.Module]] = {}  # id -> (depth of its qualified name, module)
    for name, module in model.named_modules(remove_duplicate=True):
        parent = model.get_submodule(name.rpartition(".")[0]) if "." in name else model
        if (id(parent) in lists or getattr(module, SHARD_UNIT, False)) and module is not model:
            depth.setdefault(id(module), (name.count("."), module))
    return [module for _, module in sorted(depth.values(), key=lambda entry: entry[0])]


@contextmanager
def quiet_view_warnings() -> Iterator[None]:
    """FSDP2's warning that a sharded module returned a view (nn.Linear's output on 3-D input is one) silenced
    for the trainer's run only: an in-place op on such an output would skip the pre-backward hook, and the
    modules the trainer shards feed losses and timm's / transformers' out-of-place residual adds, so the
    warning would only alarm. Outside the run (a user's own FSDP code) it is left alone."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=VIEW_WARNING, category=UserWarning)
        yield


def mixed_precision(amp: str):
    """FSDP2's MixedPrecisionPolicy for --amp: bf16 parameters in forward and backward, float32 reductions."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    if amp == "bf16":
        return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    return MixedPrecisionPolicy()


def shard(model: nn.Module, mesh, amp: str = "none", frozen: bool = False) -> nn.Module:
    """fully_shard on each block, then the root, over all ranks (a 1-D mesh). A frozen model (a teacher: no
    gradients, no optimizer state) shards the same way, but its root reshards after forward too, since no
    backward follows to do it. Returns the model (FSDP2 shards in place)."""
    from torch.distributed.fsdp import fully_shard

    policy = mixed_precision(amp)
    for block in reversed(blocks(model)):  # innermost first: a stage is sharded after its blocks
        fully_shard(block, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy, reshard_after_forward=True if frozen else None)
    return model


def prepare(model: nn.Module, config, world: int, device: torch.device, companions=(), frozen=()) -> nn.Module:
    """The model as the optimizer must see it: checkpointed blocks if asked, sharded under fsdp on >1 ranks
    (one process has nothing to shard: it trains the plain model and writes the same sharded checkpoints),
    with its companions (an EMA copy) and the frozen models the task runs (a teacher) on the same mesh."""
    check_strategy(config)
    if config.grad_checkpointing:
        set_grad_checkpointing(model)
    if config.strategy != "fsdp" or world == 1:
        return model
    mesh = device_mesh(world, device, config.shard_size)
    for other in companions:
        shard(other, mesh, config.amp)
    for other in frozen:
        shard(other, mesh, config.amp, frozen=True)
    return shard(model, mesh, config.amp)


def is_sharded(model: nn.Module) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return any(isinstance(m, FSDPModule) for m in model.modules())


@contextmanager
def gathered(*models: nn.Module | None, frozen: tuple | list = ()) -> Iterator[None]:
    """Every sharded module's full parameters on each rank for the block, kept across forwards, so that
    evaluation runs collective-free (ranks may see different numbers of batches); resharded after. frozen:
    models sharded with shard(frozen=True), whose roots go back to releasing their parameters after forward."""
    from torch.distributed.fsdp import FSDPModule

    trained = [model for model in models if model is not None and isinstance(model, FSDPModule)]
    roots = trained + [model for model in frozen if isinstance(model, FSDPModule)]
    sharded = [m for root in roots for m in root.modules() if isinstance(m, FSDPModule)]
    for module in sharded:
        module.unshard()
        module.set_reshard_after_forward(False, recurse=False)
    try:
        yield
    finally:
        for module in sharded:  # shard()'s settings back: only a trained root keeps its parameters after forward
            module.reshard()
            module.set_reshard_after_forward(not any(module is root for root in trained), recurse=False)


def save_full_weights(model: nn.Module, path: Path | None) -> None:
    """A sharded model's plain model.safetensors (path on rank 0, None on the others), never whole on one rank:
    every rank gathers one tensor at a time in the same order (DTensor.full_tensor, a collective), rank 0 writes
    it from host memory and drops it before the next. Beyond its shards rank 0 holds one whole tensor."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict
    from torch.distributed.tensor import DTensor

    state = get_model_state_dict(model)  # this rank's shards (DTensors) under the plain model's names

    def fetch(key: str) -> torch.Tensor:
        value = state[key]
        return value.full_tensor() if isinstance(value, DTensor) else value

    write_safetensors(path, layout_of(state), fetch)


def state_bytes(model: nn.Module, optimizer) -> int:
    """This rank's bytes of parameters, gradients and optimizer state (of a sharded tensor, its local shard):
    what ddp keeps whole on every rank and fsdp divides among them."""
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    states = [v for state in optimizer.state.values() for v in state.values() if torch.is_tensor(v) and v.dim()]
    tensors = [getattr(t, "_local_tensor", t) for t in [*model.parameters(), *grads, *states]]
    return sum(t.numel() * t.element_size() for t in tensors)


def local_norm(norm: torch.Tensor) -> torch.Tensor:
    """A gradient norm as a plain tensor: the full value of a sharded (DTensor) norm."""
    return norm.full_tensor() if hasattr(norm, "full_tensor") else norm
