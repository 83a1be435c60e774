"""The compute canary on an FSDP2 model (``fully_shard``: a 1-D mesh, HSDP's 2-D mesh): the
DDP canary's schedule, input and vote (``canary/schedule.py``), with the probe run on the FULL
parameters and FSDP2's own hooks out of the way.

Why the same idea holds. Every rank of the data-parallel group (the exchange group: the 1-D
mesh, or HSDP's whole (replicate, shard) mesh) holds shards of the same parameters, so every
rank can compute the same probe once it has their full values: ``DTensor.full_tensor()`` of
each parameter (an all-gather along the shard dimension, identical on every rank; nothing
where a dimension is replicated). Every rank then runs the same forward and backward on the
same plain tensors, the owner's slice, the same seed and cotangent — at any mesh shape, so an
SDC'd rank is named as under DDP (W ≥ 3: the outlier; W = 2: either side).

What is not touched (the trap: the probe reaches the user's FSDP modules, whose forward hooks
would unshard, register the post-backward reduce-scatter into the sharded ``.grad``, prefetch,
and move FSDP2's training state). The probe runs
  * inside ``hidden_fsdp_hooks``: every FSDP state's forward pre- and post-hook (the handles
    FSDP2 keeps, ``_pre_forward_hook_handle``/``_post_forward_hook_handle``) taken out of their
    modules' hook dicts for the probe and put back in their places after it — so no all-gather
    or reduce-scatter of FSDP2's, no ``_training_state`` change, no post-backward hook and no
    pre-backward hook on the probe's tensors, and the root's lazy init is not re-entered; the
    user's own hooks still run;
  * on stand-ins (``canary.probe.run_probe``): the full tensors, new leaves, so the sharded
    parameters' ``.grad`` and the guard's post-accumulate-grad hooks are not reached; buffers
    cloned; RNG streams forked.
  * before FSDP2's own root pre-forward (the canary's pre-hook is prepended after it), where
    FSDP2 is idle and its parameters are the sharded ones.
The probe computes in the parameters' own dtype (a ``MixedPrecisionPolicy``'s casts are
FSDP2's hooks): the same computation on every rank, not the training step's precision.

The compare: one small gather of the canary's row (head + one digest per parameter) in the
optimizer step's pre-hook of the step after the probe, after the guard's exchange passed there
(the clocks agree, so every rank is at the same step), before the optimizer applies anything;
then the settle (``Canary.settled``: the next capture's broadcast). So the canary adds, every K
steps, the probe's P all-gathers, two broadcasts and one gather; nothing on other steps.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn
from torch.distributed.fsdp import FSDPModule
from torch.optim.optimizer import register_optimizer_step_pre_hook

from openclaw_ref.sync.canary.probe import ProbeResult, run_probe
from openclaw_ref.sync.canary.row import ProbeCall
from openclaw_ref.sync.canary.schedule import Canary
from openclaw_ref.sync.errors import ComputeMismatch
from openclaw_ref.sync.fsdp.canary_units import UnitGather, full_value
from openclaw_ref.sync.fsdp.guard import FSDPGuard

_HANDLES = ("_pre_forward_hook_handle", "_post_forward_hook_handle")


def hooks_found(model: nn.Module) -> bool:
    """Whether every FSDP state in ``model`` keeps the handles of its forward hooks where
    ``hidden_fsdp_hooks`` looks (torch's private attributes: a probe that cannot hide them
    would run through them, so the canary is refused instead)."""
    return all(getattr(m._get_fsdp_state(), name, None) is not None
               for m in model.modules() if isinstance(m, FSDPModule) for name in _HANDLES)


def _fsdp_handles(model: nn.Module) -> list[Any]:
    """Every forward pre-/post-hook handle of every FSDP state in ``model``."""
    if not hooks_found(model):
        raise RuntimeError("FSDP2's forward hook handles are not where they were at harden()")
    out: list[Any] = []
    for module in model.modules():
        if isinstance(module, FSDPModule):
            state = module._get_fsdp_state()
            for handle in (getattr(state, name) for name in _HANDLES):
                out += list(getattr(handle, "handles", (handle,)))
    return out


@contextmanager
def hidden_fsdp_hooks(model: nn.Module) -> Iterator[None]:
    """FSDP2's own forward hooks out of their hook dicts for the block, then back in order
    (hooks registered meanwhile kept after them)."""
    saved: dict[int, tuple[dict, list]] = {}
    for handle in _fsdp_handles(model):
        hooks = handle.hooks_dict_ref()
        if hooks is not None and handle.id in hooks:
            saved.setdefault(id(hooks), (hooks, list(hooks.items())))
            del hooks[handle.id]
    try:
        yield
    finally:
        for hooks, items in saved.values():
            known = {k for k, _ in items}
            added = [(k, v) for k, v in hooks.items() if k not in known]
            hooks.clear()
            hooks.update(items)
            hooks.update(added)


class FSDPCanary(Canary):
    """The canary of one FSDP guard (module docstring); the guard's clock is its optimizer
    steps."""

    guard: FSDPGuard

    def __init__(self, guard: FSDPGuard, every: int) -> None:
        super().__init__(guard, every)
        self._seen = guard.clock
        self.units = UnitGather(guard.module)  # one unit's parameters gathered at a time

    def install(self) -> list[Any]:
        """The forward pre-hook, ahead of FSDP2's (and of the guard's, if installed later),
        and the optimizer step pre-hook, after the guard's (registered after it)."""
        module = self.guard.module
        self._remember_forwards()
        return [module.register_forward_pre_hook(self._before_forward, with_kwargs=True,
                                                 prepend=True),
                register_optimizer_step_pre_hook(self._after_exchange)]

    def _execute(self, call: ProbeCall) -> ProbeResult:
        self.probing = True
        try:
            module = self.guard.module
            return run_probe(module, self.guard.tracked, call.args, call.kwargs, call.seed,
                             forward=self._forward, digest=self.digest, buffers=call.buffers,
                             value=full_value, around=lambda: hidden_fsdp_hooks(module),
                             lazy=self.units)
        finally:
            self.probing = False

    def _after_exchange(self, optimizer, args, kwargs) -> None:
        """After the guard's step exchange passed (its optimizer-step count moved): compare
        the probe due at that step, then settle it (the next capture's broadcast)."""
        guard = self.guard
        if guard.closed or guard.clock == self._seen:
            return  # another optimizer, or the guard's exchange did not run
        self._seen = guard.clock
        step = guard.clock - 1
        try:
            if step == self._compare_at and not self._compare_tolerant:  # bitwise: this row
                self.fold(None)  # the probe's row is sent once
                rows = self._gather(torch.tensor(self.gather_row(), dtype=torch.int64))
                error = self.divergence(rows, list(range(guard.world_size)), step=step)
                if error is not None:
                    raise error.renumbered(guard.global_ranks)
            self.settled(step)  # under the tolerance, the compare is there
        except ComputeMismatch as error:
            guard.fail(error)


def fsdp_canary_for(guard: FSDPGuard, every: int) -> FSDPCanary | None:
    """The FSDP guard's canary, installed; None when ``every`` is 0 (off) or nothing is
    tracked."""
    if every <= 0 or not guard.tracked:
        return None
    canary = FSDPCanary(guard, every)
    guard.handles += canary.install()
    return canary
