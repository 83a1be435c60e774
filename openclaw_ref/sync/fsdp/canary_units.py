"""The FSDP2 canary's parameters, gathered one FSDP unit at a time: the probe never holds more
than the root unit's full parameters and one other unit's (and that unit's nested units'),
however many units the model has — where gathering every parameter up front would hold a
second, unsharded copy of the whole model.

How. For the probe only, every FSDP unit below the root (``fully_shard`` applied to it) has
its ``forward`` wrapped: the call runs under ``torch.utils.checkpoint`` (non-reentrant), and
inside it the unit's own parameters — those not in a nested unit — get their full values
(``DTensor.full_tensor()``: an all-gather, the same on every rank) swapped in for the call
(``_reparametrize_module``). The checkpoint keeps no activation of the unit: its saved tensors
— the full weights among them — are dropped when the unit returns and recomputed, gathered
again, when the backward reaches it. Each full value comes out of ``_Gathered``, an autograd
function whose backward hands the parameter's probe gradient to the canary's stream
(``canary.stream``) and returns nothing: no leaf holds it, so nothing keeps the full tensor
alive, and no gradient reaches a sharded parameter. FSDP2's own hooks stay hidden
(``fsdp.canary.hidden_fsdp_hooks``); the root unit's parameters are stand-ins as under DDP.

The order of the gathers is the forward's, then the backward's recomputations: the same on every
rank, because every rank runs the same probe on the same input (FSDP2 itself needs every rank
to call the same units).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor
from torch.nn.utils.stateless import _reparametrize_module
from torch.utils.checkpoint import checkpoint

from openclaw_ref.sync.canary.stream import GradStream


def full_value(p: torch.Tensor) -> torch.Tensor:
    """A parameter's full values as a plain tensor: a DTensor's all-gathered, else detached."""
    if isinstance(p, DTensor):
        return p.detach().full_tensor().clone()
    return p.detach()


def _full_bytes(p: torch.Tensor) -> int:
    return p.numel() * p.element_size()  # a DTensor's numel is its full tensor's


def managed(unit: nn.Module) -> list[tuple[str, nn.Parameter]]:
    """``unit``'s own parameters, named relative to it: those of no nested FSDP unit."""
    nested = {id(p) for name, sub in unit.named_modules() if name and isinstance(sub, FSDPModule)
              for p in sub.parameters()}
    return [(n, p) for n, p in unit.named_parameters(remove_duplicate=False)
            if id(p) not in nested]


class _Parameter:
    """A parameter passed to ``_Gathered`` in a box, so that autograd does not make it an
    input: no gradient may ever be asked of the sharded parameter."""

    def __init__(self, p: torch.Tensor, indices: Sequence[int]) -> None:
        self.p, self.indices = p, indices


class _Gathered(torch.autograd.Function):
    """A parameter's full value, a function of a scalar anchor only; its backward puts the
    gradient into the stream (module docstring)."""

    @staticmethod
    def forward(ctx, anchor: torch.Tensor, box: _Parameter, stream: GradStream,
                note: Callable[[torch.Tensor], None]) -> torch.Tensor:
        ctx.indices, ctx.stream = box.indices, stream
        full = full_value(box.p)
        note(full)
        return full

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[None, None, None, None]:
        if ctx.indices:
            ctx.stream.put(ctx.indices, grad)
        return None, None, None, None


class UnitGather:
    """The lazily gathered parameters of one FSDP2 model's probe (``canary.probe``'s
    ``LazyParameters``): ``ids`` of every parameter below the root unit, and the most bytes of
    full parameters held at once by the last probe (``peak_bytes``, the root's included)."""

    def __init__(self, root: nn.Module) -> None:
        self.units = [m for name, m in root.named_modules() if name and isinstance(m, FSDPModule)]
        self.own = {id(u): managed(u) for u in self.units}
        self.ids = frozenset(id(p) for u in self.units for _, p in self.own[id(u)])
        self.root_bytes = sum(_full_bytes(p) for p in root.parameters() if id(p) not in self.ids)
        self.peak_bytes = 0
        self._live: weakref.WeakSet[torch.Tensor] = weakref.WeakSet()

    def _note(self, full: torch.Tensor) -> None:
        self._live.add(full)
        live = sum(t.numel() * t.element_size() for t in self._live)
        self.peak_bytes = max(self.peak_bytes, self.root_bytes + live)

    @contextmanager
    def installed(self, stream: GradStream, where: dict[int, list[int]]) -> Iterator[None]:
        """Every unit's forward wrapped (module docstring) for the block, then put back."""
        anchor = torch.zeros((), requires_grad=True)
        self.peak_bytes = self.root_bytes
        saved = [(u, u.__dict__.get("forward")) for u in self.units]
        for u in self.units:
            u.forward = self._call(u, u.forward, anchor, stream, where)
        try:
            yield
        finally:
            for u, own in saved:
                if own is None:
                    del u.forward
                else:
                    u.forward = own

    def _call(self, unit: nn.Module, forward: Callable[..., Any], anchor: torch.Tensor,
              stream: GradStream, where: dict[int, list[int]]) -> Callable[..., Any]:
        params = self.own[id(unit)]

        def gathered(*args: Any, **kwargs: Any) -> Any:
            full = {n: _Gathered.apply(anchor, _Parameter(p, where.get(id(p), ())), stream,
                                       self._note) for n, p in params}
            with _reparametrize_module(unit, full):
                return forward(*args, **kwargs)

        def call(*args: Any, **kwargs: Any) -> Any:
            return checkpoint(gathered, *args, use_reentrant=False, **kwargs)

        return call
