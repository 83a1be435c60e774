"""The hook-cost job's ``floor`` arm: stock DDP plus ONE bare exchange per step of exactly the
step guard's bytes, nothing checked.

Why it is the floor: any design that reads a per-step verdict before the optimizer applies the
step must move at least one collective per step and wait for it before the optimizer. This arm
pays exactly that and nothing else — the guard's own buffer (``step_setup.exchange_block``: the
same element count and dtype as the guard's exchange on the same process group), issued where
the guard issues it (a callback queued when the backward reaches the forward's output, which
runs at the end of the backward's graph task, before DDP's finalize waits for its last bucket,
so the exchange overlaps that bucket) and waited on there, as the guard waits on CPU. No
gradient, buffer, RNG stream or reducer state is touched, so it trains bitwise as stock DDP.
``hardened ÷ floor`` is what the guard's checks cost above the one collective.

``nancheck=True`` (the ``floor+nancheck`` arm) adds the guard's hooks on the accumulators DDP
hooked, each summing its gradient as it is accumulated (``precision.finite_sum``), and the
rank's flag read on the host before the exchange is issued: the one pass over the local
gradients no guard that names a rank's NaN can avoid, plus the Python call per gradient that
the guard's hooks make anyway (they also record presence). So ``floor+nancheck ÷ floor`` is
that pass with those calls (on a model of many small parameters, the calls dominate), and
``hardened-noreplica ÷ floor+nancheck`` the rest of the guard's bookkeeping (slots, counts,
the verdict).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils._pytree import tree_leaves

from openclaw_ref.sync.ddp.step_setup import exchange_block, queue_callback
from openclaw_ref.sync.evidence.averaged import _accumulator
from openclaw_ref.sync.evidence.precision import finite_sum, nonfinite_flags


class ExchangeFloor:
    """The per-step bare exchange on one DDP model, with the surface the hook-cost job asks of
    a guard (``finish_step``, ``events``, ``held_bytes``, ``close``)."""

    def __init__(self, ddp: DDP, nancheck: bool = False) -> None:
        self.group = ddp.process_group
        device = next(ddp.parameters()).device
        self.block = exchange_block(dist.get_world_size(self.group), device)
        self.events: list = []  # nothing is checked, so nothing is ever reported
        self.exchanges = 0
        self._task = -2  # the graph task whose end runs the exchange (one per backward)
        self.sums: list[torch.Tensor] = []  # this backward's local sums (``nancheck``)
        self._flags: list = []  # each step's flag (a bool on a CPU, a tensor on a device)
        self._handles = [ddp.module.register_forward_hook(self._forward)]
        if nancheck:
            self._handles += [_accumulator(p).register_hook(self._summer(p))
                              for p in ddp.module.parameters() if p.requires_grad]
        self.nancheck = nancheck

    def _summer(self, p: torch.nn.Parameter):
        sums = self.sums

        def summed(grad_inputs, grad_outputs) -> None:
            if p.grad is not None:
                sums.append(finite_sum(p.grad))
        return summed

    def _forward(self, module, args, output) -> None:
        if not torch.is_grad_enabled():
            return
        out = next((t for t in tree_leaves(output)
                    if isinstance(t, torch.Tensor) and t.grad_fn is not None), None)
        if out is not None:
            out.grad_fn.register_prehook(lambda grads: self._arm())

    def _arm(self) -> None:
        task = torch._C._current_graph_task_id()
        if task != self._task:
            self._task = task
            queue_callback(self._exchange)

    def _exchange(self) -> None:
        self._task = -2
        if self.nancheck:  # on a device the flag stays there, as the guard's does: no sync
            flag = nonfinite_flags(self.sums)[0]
            self._flags.append(flag)
            self.sums.clear()
        dist.all_reduce(self.block, group=self.group, async_op=True).wait()
        self.exchanges += 1

    @property
    def flagged(self) -> int:
        """Steps whose pass found a non-finite local gradient (read on the host when asked)."""
        return sum(bool(f) for f in self._flags)

    def finish_step(self) -> bool:
        return True

    def held_bytes(self) -> int:
        return self.block.numel() * self.block.element_size()

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()
