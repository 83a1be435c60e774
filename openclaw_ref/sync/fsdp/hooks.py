"""What the FSDP2 guard attaches to FSDP2 besides plain tensor hooks: the reduce-scatter
wrapper (``FSDPModule.set_custom_reduce_scatter``) and the ``load_state_dict`` counter.

Invariant: the wrapper changes nothing FSDP2 reduces — it calls FSDP2's own comm with the same
arguments (the same collective, bit for bit); what it adds runs before that call.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import FSDPModule
from torch.distributed.fsdp._fully_shard._fsdp_api import ReduceScatter

from openclaw_ref.sync.evidence.precision import finite_sum


class CheckedReduceScatter(ReduceScatter):
    """FSDP2's reduce-scatter comm with this rank's non-finite sum taken first, and, with
    ``before`` (the opt-in reduce check), a call with the input's element count ahead of the
    collective: allocation and the collective are the wrapped comm's own."""

    def __init__(self, inner: ReduceScatter, sums: list[torch.Tensor],
                 before: Callable[[int], None] | None = None) -> None:
        self.inner, self.sums, self.before = inner, sums, before
        self.active = True

    def allocate(self, size, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return self.inner.allocate(size, dtype=dtype, device=device)

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor,
                 group: dist.ProcessGroup, op, async_op: bool = False):
        if self.active:
            self.sums.append(finite_sum(input_tensor))
            if self.before is not None:
                self.before(input_tensor.numel())
        return self.inner(output_tensor, input_tensor, group, op, async_op)


class Restore:
    """Handle that puts an FSDP module's own reduce-scatter comm back (``close()``)."""

    def __init__(self, module: FSDPModule, comm: CheckedReduceScatter) -> None:
        self.module, self.comm = module, comm

    def remove(self) -> None:
        self.comm.active = False
        self.module.set_custom_reduce_scatter(self.comm.inner)


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
