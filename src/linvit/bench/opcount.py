"""Count the ATen operators one call launches: the host-side cost that bounds small-batch GPU latency.

Eager PyTorch pays Python and a kernel launch per operator, so at batch 1 on a fast GPU the count of
real (non-view) operators, not FLOPs, sets the floor. Views (reshape of a contiguous tensor, transpose,
expand, ...) launch nothing and are not counted.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten


def _is_view(func) -> bool:
    schema = func._schema
    if func.overloadpacket in (aten.lift_fresh, aten.detach, aten._unsafe_view, aten.alias):
        return True  # aliases that launch nothing, though their schemas do not say so
    # a view returns an alias of an input and writes nothing: its return carries an alias annotation
    return any(r.alias_info is not None and not r.alias_info.is_write for r in schema.returns)


class OpCounter(TorchDispatchMode):
    """Dispatch mode that tallies the non-view ATen operators run inside it (by overload name)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not _is_view(func):
            self.ops[str(func.overloadpacket.__name__)] += 1
        return func(*args, **(kwargs or {}))

    @property
    def total(self) -> int:
        return sum(self.ops.values())


def count_ops(fn: Callable[[], object]) -> OpCounter:
    """Run fn once and return the counter (``.total``, ``.ops``: per-operator tallies)."""
    with OpCounter() as counter:
        fn()
    return counter
