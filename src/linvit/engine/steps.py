"""The steps of one training epoch, for every task: backward, clipping, the optimizer and schedule, the numbers."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
import torch.nn as nn
from tqdm import tqdm

from ..distributed import all_reduce_sum, all_reduce_tensor
from .health import DeadHeadStats, GradNormStats
from .sharding import local_norm

# steps between the collective finiteness checks (and progress-bar updates): the only host syncs of an epoch
CHECK_EVERY = 50


def optimizer_step(loss: torch.Tensor, model: nn.Module, optimizer, scaler, clip_grad: float | None) -> torch.Tensor:
    """Backward (scaled for fp16), optional gradient clipping, one optimizer step.

    Returns the global L2 norm of the (unscaled) gradients before clipping, on the device (no host sync): the
    training-health number the epoch records."""
    optimizer.zero_grad(set_to_none=True)
    if scaler is not None:
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
    else:
        loss.backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    norm = local_norm(torch.nn.utils.get_total_norm(grads)) if grads else torch.zeros((), device=loss.device)
    if clip_grad:
        torch.nn.utils.clip_grads_with_norm_(model.parameters(), clip_grad, norm)
    if scaler is not None:
        scaler.step(optimizer)
        scaler.update()
    else:
        optimizer.step()
    return norm.detach()


def train_pass(
    run, epoch: int, batch_loss: Callable[[object], tuple[torch.Tensor, int]], after_step=None, samples: str = "images"
) -> dict:
    """One epoch of any task on a Run (its train_net, loader, optimizer, scheduler, scaler, config.clip_grad,
    config.progress): batch_loss(batch) -> (loss, count of samples: images, or a language model's sequences, the
    record's <samples>_per_second), the optimizer step, the per-iteration schedule, after_step(global step) (EMA),
    a progress bar and the epoch's numbers (summed over ranks), with the mean and largest gradient norm before
    clipping (equal on every rank: DDP's gradients are all-reduced) and the steps whose gradients were not finite
    (fp16 steps the scaler skipped).

    The running loss stays on the device: the host waits only every CHECK_EVERY steps, where every rank
    takes part in one all-reduce of the non-finite count and all of them stop together (a loss that is NaN on
    one rank only no longer leaves the others waiting in the next gradient all-reduce).
    """
    net, loader, device = run.train_net, run.loader, run.device
    net.train()
    updates = len(loader)
    loss_sum = torch.zeros((), device=device)
    nonfinite = torch.zeros((), device=device)
    grad_norms, dead, seen = GradNormStats(device), DeadHeadStats(net), 0
    start = time.perf_counter()
    bar = tqdm(loader, desc=f"epoch {epoch}", unit="batch", disable=run.rank != 0 or not run.config.progress)
    if epoch:  # the lr of the step count, not the optimizer's: a resumed run's plan may have changed since
        run.scheduler.step_update(num_updates=epoch * updates)
    for step, batch in enumerate(bar):
        loss, count = batch_loss(batch)
        grad_norms.add(optimizer_step(loss, net, run.optimizer, run.scaler, run.config.clip_grad))
        run.scheduler.step_update(num_updates=epoch * updates + step + 1)
        if after_step is not None:
            after_step(epoch * updates + step)
        loss = loss.detach().float()
        nonfinite += ~torch.isfinite(loss)
        loss_sum += loss * count
        seen += count
        if (step + 1) % CHECK_EVERY == 0 or step + 1 == updates:
            stop_if_not_finite(nonfinite, epoch, step)
            lr = run.optimizer.param_groups[0]["lr"]
            bar.set_postfix(loss=f"{loss_sum.item() / max(seen, 1):.4f}", lr=f"{lr:.2e}")
    seconds = time.perf_counter() - start
    return epoch_record(run, epoch, loss_sum, seen, seconds, grad_norms, dead, samples)


def epoch_record(run, epoch: int, loss_sum, seen: int, seconds: float, grad_norms, dead, samples="images") -> dict:
    """The epoch's numbers: one host read of the device sums, one all-reduce over ranks, the epoch's lr step."""
    norms = grad_norms.values()
    dead_counts = dead.values(run.device)  # per head: images with all-zero scores (and the layers' image counts)
    local_loss, *values = torch.cat([loss_sum.reshape(1), norms, dead_counts]).tolist()  # one host sync
    norm_values, dead_values = values[: norms.numel()], values[norms.numel() :]
    loss_total, seen, *dead_values = all_reduce_sum([local_loss, seen, *dead_values], run.device)  # one collective
    run.scheduler.step(epoch + 1)
    return {
        "train_loss": loss_total / max(seen, 1),
        "lr": run.optimizer.param_groups[0]["lr"],
        "epoch_seconds": seconds,
        f"{samples}_per_second": seen / seconds if seconds > 0 else None,
        **GradNormStats.record(norm_values),
        **dead.record(dead_values),
    }


def stop_if_not_finite(nonfinite: torch.Tensor, epoch: int, step: int) -> None:
    """Collective: every rank calls it at the same step and raises if any rank saw a non-finite loss."""
    count = int(all_reduce_tensor(nonfinite.clone()).item())
    if count:
        raise FloatingPointError(
            f"{count} non-finite loss value(s) by epoch {epoch} step {step} (checked every {CHECK_EVERY} steps "
            "on all ranks); stopping. Try a lower --lr, --clip-grad, or --amp none"
        )
