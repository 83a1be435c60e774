"""What the FSDP2 guard attaches to FSDP2 besides plain tensor hooks: the reduce-scatter and
all-gather wrappers (``FSDPModule.set_custom_reduce_scatter``/``set_custom_all_gather``) and the
``load_state_dict`` counter.

Invariant: the wrappers change nothing FSDP2 sends — each calls FSDP2's own comm with the same
arguments (the same collective, bit for bit); what it adds runs before that call, or after it
fails. One thing moves: a collective FSDP2 waits on at once (``async_op=False``, the
reduce-scatter always) is issued asynchronously and waited on in the wrapper, as gloo's
synchronous call does inside, so that the watchdog can watch its ``Work`` meanwhile
(``evidence/outside_work.py``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import FSDPModule
from torch.distributed.fsdp._fully_shard._fsdp_api import AllGather, ReduceScatter

from openclaw_ref.sync.errors import ConsistencyError
from openclaw_ref.sync.evidence.precision import finite_sum

Watch = Callable[[object, int | None], Callable[[], None]]  # (work, numel) -> what forgets it


def call_watched(issue: Callable[[bool], object], async_op: bool, watch: Watch | None,
                 numel: int | None) -> object:
    """``issue(async_op)`` as FSDP2 asked, or — when FSDP2 would wait at once — issued
    asynchronously and waited on here under ``watch``; returns what the comm returns."""
    if async_op or watch is None:
        return issue(async_op)
    work = issue(True)
    if work is None:  # this rank is not in the group
        return None
    forget = watch(work, numel)
    try:
        work.wait()
    finally:
        forget()
    return None


class CheckedReduceScatter(ReduceScatter):
    """FSDP2's reduce-scatter comm with this rank's non-finite sum taken first and ``before``
    called with the input's element count (the short note; the opt-in reduce check). A backend
    error is raised as what ``failed(numel)`` makes of it, or as it was (None).
    Allocation and the collective are the wrapped comm's own."""

    def __init__(self, inner: ReduceScatter, sums: list[torch.Tensor],
                 before: Callable[[int], None],
                 failed: Callable[[int], ConsistencyError | None],
                 watch: Watch | None = None) -> None:
        self.inner, self.sums, self.before, self.failed = inner, sums, before, failed
        self.watch = watch
        self.active = True

    def allocate(self, size, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return self.inner.allocate(size, dtype=dtype, device=device)

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor,
                 group: dist.ProcessGroup, op, async_op: bool = False):
        if not self.active:
            return self.inner(output_tensor, input_tensor, group, op, async_op)
        self.sums.append(finite_sum(input_tensor))
        self.before(input_tensor.numel())
        try:
            return call_watched(lambda a: self.inner(output_tensor, input_tensor, group, op, a),
                                async_op, self.watch, input_tensor.numel())
        except RuntimeError as exc:
            error = self.failed(input_tensor.numel())
            if error is None:
                raise
            raise error from exc


class CheckedAllGather(AllGather):
    """FSDP2's all-gather comm, called as it is; a backend error is raised as what
    ``failed()`` makes of it, or as it was (None)."""

    def __init__(self, inner: AllGather,
                 failed: Callable[[], ConsistencyError | None],
                 watch: Watch | None = None) -> None:
        self.inner, self.failed, self.watch = inner, failed, watch
        self.active = True

    def allocate(self, size, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return self.inner.allocate(size, dtype=dtype, device=device)

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor,
                 group: dist.ProcessGroup, async_op: bool = False):
        try:
            return call_watched(lambda a: self.inner(output_tensor, input_tensor, group, a),
                                async_op, self.watch if self.active else None, None)
        except RuntimeError as exc:
            error = self.failed() if self.active else None
            if error is None:
                raise
            raise error from exc


class Restore:
    """Handle that puts an FSDP module's own comms back (``close()``)."""

    def __init__(self, module: FSDPModule, reduce_scatter: CheckedReduceScatter,
                 all_gather: CheckedAllGather) -> None:
        self.module, self.reduce_scatter, self.all_gather = module, reduce_scatter, all_gather

    def remove(self) -> None:
        self.reduce_scatter.active = self.all_gather.active = False
        self.module.set_custom_reduce_scatter(self.reduce_scatter.inner)
        self.module.set_custom_all_gather(self.all_gather.inner)


class LoadCounter:
    """Counts ``load_state_dict`` calls into a model (its root or any submodule; also
    ``torch.distributed.checkpoint.state_dict.set_model_state_dict``, which calls the root's):
    a post-hook on every module, one call counted once however many modules it loads. The
    modules of one call share its ``missing_keys`` list; the last call's list is held, so a
    new call's list is another object."""

    def __init__(self, model: nn.Module) -> None:
        self.count = 0
        self._last: list | None = None
        self.handles = [m.register_load_state_dict_post_hook(self._loaded)
                        for m in model.modules()]

    def _loaded(self, module: nn.Module, incompatible) -> None:
        if incompatible.missing_keys is not self._last:
            self._last = incompatible.missing_keys
            self.count += 1

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles.clear()
