"""``averaged``: were this backward's gradients averaged by DDP? One watch per hardened model.

The invariant: a backward that accumulates a gradient into a parameter DDP synchronizes, after
a forward DDP was asked to synchronize (``require_backward_grad_sync`` set, outside
``no_sync()``: DDP's own forward, or the inner module called directly), issues at least one
bucket through the hardened comm hook. DDP's own forward is however it is reached (``ddp(x)``,
``ddp.forward(x)``, a compiled DDP, another wrapper's forward calling it): ``ddp_forward``,
asked by a forward pre-hook on ``ddp.module``. Two published silent errors break it on every rank at
once, with no collective to disagree on: a forward through ``ddp.module`` (DDP's reducer is
never armed) and a dtype/device conversion after wrapping (``ddp.double(); ddp.float()``,
``.cpu()``/``.cuda()`` as in pytorch#104336: autograd replaces the gradient accumulators DDP
hooked, so DDP never sees a gradient).

How: a forward hook on ``ddp.module`` puts one pre-hook on the output's autograd node; when the
backward reaches it, it queues an end-of-backward callback that queues a second one, which so
runs after every callback queued during the backward (DDP's own; static graph's delayed first
allreduce) and compares the hook's progress (clock, issued records) with its value at the
forward. Per step: one forward hook, one node pre-hook, two callbacks, O(1) Python (~10 µs
timed by hand on CPU, not by the hook-cost job; nothing per bucket). Only when no bucket was
issued does the watch look at the parameters (O(parameters), asking the engine whether their
accumulators ran), and end the step from ``backward()``, so the optimizer never applies it. A
backward that reaches no parameter (a loss that does not depend on them, ``autograd.grad``
towards the inputs) is silent.

A parameter replaced after wrapping is seen two ways: its gradient accumulator is not the one
DDP hooked (a conversion), or the module holds another Parameter object under its name
(``module.w = nn.Parameter(...)``). In DDP's own forward, with no parameter replaced, "no
bucket" has one cause: this rank's DDP
stopped before bucket 0 (a parameter of that bucket got no gradient under
``find_unused_parameters=False``; DDP issues buckets in index order), while the other ranks may
have issued theirs and wait inside bucket 0's allreduce. That is the last-bucket-missing case
at its extreme, and every cause takes its path (``unissued``: every bucket sent as zeros marked
"never issued" with the cause, ``control_layout.NotIssued``, then the step judged), since the
other ranks may be waiting whatever the cause (one rank's forward through ``ddp.module``):
every rank raises the same error at the same step, worded from the slots
(``control.not_reduced``) — ``GradientsNotAveraged`` for a bypass or a replacement,
``MissingGradient`` for a DDP that stopped.
"""

from __future__ import annotations

import enum
from collections.abc import Callable

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils._pytree import tree_leaves

from openclaw_ref.sync.errors import GradientsNotAveraged
from openclaw_ref.sync.evidence.control_layout import NotIssued


class Cause(enum.Enum):
    """Why a backward reduced no bucket although parameters received gradients."""

    BYPASSED = ("the forward ran through ddp.module, not the DistributedDataParallel wrapper, so "
                "DDP never averaged this step's gradients across ranks: call ddp(inputs) (to "
                "accumulate gradients without averaging them, use ddp.no_sync())")
    REPLACED = ("parameters were replaced after DDP wrapped them (a dtype/device conversion such "
                "as .double()/.float()/.to()/.cpu()/.cuda() after wrapping?): DDP no longer sees "
                "their gradients, so none were averaged: convert the model before wrapping it, "
                "or wrap it again")
    NO_BUCKET = ("parameters received gradients in a backward through the DDP wrapper, but DDP "
                 "reduced no bucket and the step's check raised nothing: gradients were never "
                 "averaged")


def _accumulator(p: nn.Parameter):
    """The autograd node that accumulates ``p.grad`` now (the one DDP hooked, unless replaced)."""
    with torch.enable_grad():
        return p.view_as(p).grad_fn.next_functions[0][0]


def _accumulates(p: nn.Parameter) -> bool:
    """Inside a backward: does the running graph task accumulate a gradient into ``p``?"""
    try:
        return bool(torch._C._will_engine_execute_node(_accumulator(p)))
    except RuntimeError:  # autograd.grad(): it accumulates into no leaf
        return False


def ddp_forward(ddp: DDP) -> bool:
    """Is the forward now running DDP's own, the one that prepares its reducer for the backward?
    Asked from a forward pre-hook of the module DDP runs. DDP's forward, however it is reached —
    ``ddp(x)``, ``ddp.forward(x)`` (which skips the DDP object's ``__call__`` and so its forward
    pre-hooks), a compiled DDP, DDP inside another wrapper's forward — first prepares its
    reducer (``_pre_forward``), then runs its module inside ``_inside_ddp_forward``, which names
    it ``DistributedDataParallel._active_ddp_module`` (the status dynamo's DDPOptimizer reads);
    ``replicate()`` names its DDP so in its forward pre-hook, before it prepares the reducer. A
    forward through ``ddp.module`` runs outside both, with nothing prepared."""
    return DDP._active_ddp_module is ddp


def _queue(callback: Callable[[], None]) -> None:
    torch.autograd.Variable._execution_engine.queue_callback(callback)


class AveragingWatch:
    """Raises ``GradientsNotAveraged`` from a backward that DDP should have averaged and did
    not (see the module docstring). ``progress`` is the hook's (clock, issued records);
    ``unissued(why, concerned)`` sends this step's buckets as never issued, for ``why``
    naming the first ``concerned`` parameter, and judges the step (it raises, the same error on
    every rank)."""

    def __init__(self, ddp: nn.Module, synchronized: list[tuple[str, nn.Parameter]],
                 progress: Callable[[], tuple[int, int]], rank: int,
                 unissued: Callable[[NotIssued, list[str]], None]) -> None:
        self.ddp = ddp
        self.synchronized = synchronized
        self.progress = progress
        self.rank = rank
        self.unissued = unissued
        self.hooked = {id(p): _accumulator(p) for _, p in synchronized  # what DDP hooked
                       if p.requires_grad}
        self.via_wrapper = False  # this forward is DDP's own (``ddp_forward``)
        self.closed = False

    def module_pre_forward(self) -> None:
        """From the forward pre-hook of ``ddp.module``: is this forward DDP's own?"""
        self.via_wrapper = ddp_forward(self.ddp)

    def module_forward(self, module: nn.Module, args, output) -> None:
        """Forward hook of ``ddp.module``: watch the backward of an output that needs one."""
        via, self.via_wrapper = self.via_wrapper, False
        if self.closed or not torch.is_grad_enabled():
            return
        if not self.ddp.require_backward_grad_sync:  # no_sync(): DDP averages nothing, and a
            return  # forward around the wrapper would not have had it average either
        out = output if isinstance(output, torch.Tensor) else next(
            (t for t in tree_leaves(output) if isinstance(t, torch.Tensor) and t.requires_grad),
            None)
        node = out.grad_fn if out is not None else None
        if node is None:
            return
        mark = self.progress()
        node.register_prehook(lambda grads: _queue(lambda: _queue(lambda: self._verify(via, mark))))

    def _verify(self, via_wrapper: bool, mark: tuple[int, int]) -> None:
        if self.closed or self.progress() != mark:  # a bucket was issued: DDP averaged
            return
        received = [(n, p) for n, p in self.synchronized if p.requires_grad and _accumulates(p)]
        if not received:
            return
        cause, params, why = Cause.NO_BUCKET, [n for n, _ in received], NotIssued.STOPPED
        if not via_wrapper:
            cause, why = Cause.BYPASSED, NotIssued.BYPASSED
        else:
            current = dict(self.ddp.module.named_parameters())
            replaced = ([n for n, p in received if _accumulator(p) is not self.hooked.get(id(p))]
                        or [n for n, p in self.synchronized if current.get(n) is not p])
            if replaced:
                cause, params, why = Cause.REPLACED, replaced, NotIssued.REPLACED
        step = self.progress()[0]
        concerned = params if why is NotIssued.REPLACED else []
        self.unissued(why, concerned)  # zeros for every bucket, marked why; judged: it raises
        raise GradientsNotAveraged(cause.value, step=step, ranks=[self.rank], params=params)
