"""``Guard.BUCKET``, the forensic mode of ``harden()`` on DDP: one comm hook that makes every
bucket's sync verifiable.

``harden(ddp_model, cfg)`` works on any ``DistributedDataParallel`` model — on its own process
group (a sub-group or a DeviceMesh dimension included), under our launcher, under ``torchrun``,
inside Lightning. At construction it checks that parameter names, shapes, dtypes and order agree
on every rank of the group, starts a watchdog, and registers ``hardened_hook``. Per bucket, the
hook

  1. sums this rank's own gradients (NaN or ±inf iff one of them is: the local non-finite
     flag, read on the host only where it is already there, on a CPU);
  2. divides them by the world size in place and allreduces DDP's own bucket, with the bits
     of PyTorch's ``allreduce_hook`` (``precision.divide``: a power-of-two world size is a
     multiplication by 1/W, exact, and twice as fast on a CPU) — or, for the last bucket, an
     fp16/bf16 wire or a pre-scale, writes ``g · 2^e / W`` into the bucket's wire buffer in one
     pass (divide before the rounding); where the wire can overflow, the reduced wire is
     summed on completion and the unscaled result written back into DDP's bucket;
  3. appends its slot for the bucket — clock, bucket index, membership digest, scale exponent,
     first absent required gradient, local flag, ready time — to the step's control block
     (``control_layout.StepBlock``: Python integers, encoded once per bucket where they
     cannot change);
  4. hands the allreduce's ``Work`` to the watchdog, which polls it (gloo and NCCL alike).
The step's last bucket goes through its wire buffer with the step's control block at its tail
— counts of O(B) elements whatever the world size, this rank's digest of one slice of the
parameters included (``control_counts``, ``replica_slices``): exactly the collectives stock DDP
issues on a clean step, and per bucket one pass (the sum) more than PyTorch's
``allreduce_hook``. A step whose counts show a disagreement gathers the per-rank slots with one
extra collective, so the error names the ranks exactly as the per-rank check does.

Once DDP has issued its last bucket, at the end of the autograd graph task that bucket fired in
(a callback queued on the engine, where DDP queues its own finalize; a reentrant activation
checkpoint's nested backward included), the step is judged by ``ledger.Ledger.settle``: every
control block is checked on the device and read with one host sync; ``ClockMismatch`` /
``BucketMisalignment`` / ``ScaleMismatch`` / ``MissingGradient`` / ``NonFiniteGradient`` are
raised identically on every rank, from ``backward()`` — or, where the verdict is read later
(``SyncConfig.verdict_at``; the default on CUDA, so that backward has no host sync), from the
optimizer step's pre-hook before it applies anything, ``finish_step``, ``begin_step`` or the
next forward. A local NaN/inf is fatal under
``nonfinite="raise"``; under ``skip`` (the default) it passes through the sum as in stock DDP,
so every rank holds the same non-finite gradients and a loss scaler skips the step together;
the event names the ranks.

What the hook and the step check share (caches, clock, ledger) is ``harden_state.HardenState``.
A backward whose parameters received gradients while no bucket went through the hook (a
forward through ``ddp.module``; parameters replaced by a conversion after wrapping) raises
``GradientsNotAveraged`` from ``backward()``: ``averaged.AveragingWatch``.
``DDP.join()`` is supported: a joined rank's shadow allreduces carry a "joined" count that
abstains from every comparison (while a rank has joined, a disagreement is raised by its kind
without naming ranks: the joined rank takes no part in the gather). Replica divergence
(``replica_slices``, K = ``SyncConfig.replica_slices``) is caught within K steps and raised from
``backward()`` as ``ReplicaDivergence``, before the optimizer step.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.optim.optimizer import register_optimizer_step_pre_hook

from openclaw_ref.sync.attached import Appended, eager
from openclaw_ref.sync.base import RankInfo, SyncConfig
from openclaw_ref.sync.ddp.harden_state import HardenState
from openclaw_ref.sync.ddp.step_setup import send_used_map
from openclaw_ref.sync.evidence import checks
from openclaw_ref.sync.evidence.averaged import AveragingWatch
from openclaw_ref.sync.evidence.control_counts_write import write_counts
from openclaw_ref.sync.evidence.control_layout import NotIssued, unissued_slot
from openclaw_ref.sync.evidence.ledger import BucketRecord
from openclaw_ref.sync.evidence.precision import (
    divide,
    finite_sum,
    from_wire,
    refuse_grad_scaler,
    to_wire,
)


def _in_backward() -> bool:
    """True inside an autograd backward; DDP's join shadow calls the hook outside of one."""
    return torch._C._current_graph_task_id() != -1


def hardened_hook(state: HardenState, bucket):  # no annotations: DDP rejects string ones
    """The DDP comm hook (see the module docstring); one allreduce per bucket, like DDP's own,
    the last one carrying the step's control block. ``bucket`` is a ``dist.GradBucket``;
    returns a ``Future[Tensor]`` of the bucket's size."""
    if state.closed:
        return _plain_allreduce(state, bucket)
    if not _in_backward():
        return _shadow_allreduce(state, bucket)
    t = time.perf_counter()
    state.open_step(t)
    grads = bucket.buffer()
    n, index, last = grads.numel(), bucket.index(), bucket.is_last()
    digest, names = state.membership(bucket)
    exponent = state.policy.exponent_for(state.rank)
    local_sum = finite_sum(grads)  # NaN/±inf iff this rank's own values hold one
    state.block.add(state.slot(index, digest, exponent, t - state.step_t0,
                               state.first_absent(bucket)), local_sum)
    in_place = _in_place(state, grads, last, exponent)
    if in_place:  # as PyTorch's allreduce_hook: divide and reduce DDP's own bucket
        wire = divide(grads, state.world_size, out=grads)
        state.drop_wire(index)
    else:
        wire = state.wire_buffer(index, grads, _block_elements(state, grads) if last else 0)
        to_wire(grads, wire[:n], state.world_size, exponent, state.policy.loss_scaler)
    record = BucketRecord(index, names, n, None, wire[:n])
    work = state.reduce(record, wire, last)
    if in_place:
        record.done = work.get_future().then(lambda fut: fut.value()[0])
        return record.done
    can_overflow = exponent != 0 or wire.dtype != grads.dtype

    def unpack(fut: torch.futures.Future) -> torch.Tensor:
        fut.value()  # a failed allreduce raises here, and its error reaches settle
        if can_overflow:  # the wire itself may overflow under 2^e or in a narrower dtype
            record.flag = finite_sum(wire[:n])
        return from_wire(wire[:n], exponent, grads.dtype,
                         out=grads if can_overflow else None)

    record.done = work.get_future().then(unpack)
    return record.done


def _in_place(state: HardenState, grads: torch.Tensor, last: bool, exponent: int) -> bool:
    """Is the bucket reduced in DDP's own buffer? Yes unless it carries the step's control
    block (the last bucket), a pre-scale or a wire dtype other than the gradients'; those go
    through ``state.wire_buffer``."""
    return not last and exponent == 0 and state.policy.dtype_for(grads.dtype) == grads.dtype


def _block_elements(state: HardenState, grads: torch.Tensor) -> int:
    """Elements of the step's counted block (``control_counts``) on this bucket's wire."""
    return state.block_layout(state.policy.dtype_for(grads.dtype)).size(len(state.block))


def _plain_allreduce(state: HardenState, bucket):
    """The hook after ``close()`` (DDP cannot unregister it): PyTorch's ``allreduce_hook``."""
    grads = bucket.buffer()
    divide(grads, state.world_size, out=grads)
    fut = dist.all_reduce(grads, group=state.group, async_op=True).get_future()
    return fut.then(lambda f: f.value()[0])


def _shadow_allreduce(state: HardenState, bucket):
    """A joined rank's (``DDP.join()``) zero bucket, matching the active ranks' allreduce —
    with the last bucket, their control block too: "joined" slots abstain from their checks.
    DDP does not use the result."""
    grads = bucket.buffer()
    n, last = grads.numel(), bucket.is_last()
    exponent = state.policy.exponent_for(state.rank)
    state.add_joined_slot()
    if _in_place(state, grads, last, exponent):
        wire = grads.zero_()
    else:
        wire = state.wire_buffer(bucket.index(), grads,
                                 _block_elements(state, grads) if last else 0)
        wire[:n].zero_()
        if last:
            write_counts(wire[n:], state.block_layout(wire.dtype), state.rank, state.block.slots)
            state.block.clear()
    fut = dist.all_reduce(wire, group=state.group, async_op=True).get_future()

    def done(f: torch.futures.Future) -> torch.Tensor:
        f.value()  # a failed allreduce raises, not swallowed
        return grads

    return fut.then(done)


def _unissued_allreduce(state: HardenState, bucket, why: NotIssued,
                        concerned: Sequence[str] = ()) -> None:
    """Send zeros for a bucket of this step that this rank's DDP never issued (``bucket``: one
    of the reducer's zero-filled buckets), in the wire format the other ranks used for it, with
    a slot that says so, and ``why`` (``control_layout.unissued_slot``) and the first member
    among the ``concerned`` parameters; the last one carries the step's control block. The
    others are waiting inside these allreduces: they complete, and every rank reads the same
    block and raises the same error (``control.not_reduced``)."""
    grads = bucket.buffer()
    n, index, last = grads.numel(), bucket.index(), bucket.is_last()
    digest, names = state.membership(bucket)
    exponent = state.policy.exponent_for(state.rank)
    first = next((i for i, name in enumerate(names) if name in concerned), None)
    state.block.add(unissued_slot(state.slot(index, digest, exponent, 0.0, first), why),
                    torch.zeros((), dtype=torch.float32))
    if _in_place(state, grads, last, exponent):
        wire = grads
    else:
        wire = state.wire_buffer(index, grads, _block_elements(state, grads) if last else 0)
        wire[:n].zero_()
    record = BucketRecord(index, names, n, None, wire[:n])
    record.done = state.reduce(record, wire, last, by_ddp=False).get_future()


def _complete_unissued(state: HardenState, ddp_model: DDP,
                       why: NotIssued = NotIssued.STOPPED, concerned: Sequence[str] = ()) -> None:
    """The step's buckets this rank's DDP never issued (DDP issues them in index order, so the
    issued ones are a prefix), sent as zeros by ``_unissued_allreduce``."""
    issued = state.issued_buckets()
    unissued = [b for b in ddp_model.reducer._get_zeros_like_grad_buckets()
                if b.index() not in issued]
    for bucket in unissued:
        _unissued_allreduce(state, bucket, why, concerned)
    if unissued:  # DDP never issued its last bucket, nor so its used-parameter map
        send_used_map(ddp_model, state.group)


def _unissued_step(state: HardenState, ddp_model: DDP, why: NotIssued,
                   concerned: Sequence[str]) -> None:
    """A backward in which this rank's DDP issued no bucket (``why``: it stopped before bucket
    0, the forward bypassed the wrapper, the ``concerned`` parameters were replaced): the step's
    buckets go as zeros marked "never issued", and the step is judged — the same error on every
    rank (``averaged.AveragingWatch``)."""
    _complete_unissued(state, ddp_model, why, concerned)
    state.settle_step()


def _presence_hook(present: set[int], key: int):
    """A tensor hook recording that parameter ``key`` got a local gradient this step."""
    return lambda grad: present.add(key)


def harden_buckets(ddp_model: DDP, cfg: SyncConfig, ctx: RankInfo | None,
                   named: list[tuple[str, nn.Parameter]],
                   synchronized: list[tuple[str, nn.Parameter]]) -> HardenState:
    """``Guard.BUCKET``: register ``hardened_hook`` and what it needs (module docstring)."""
    state = HardenState(cfg, ddp_model.process_group, named, synchronized)
    state.watch(ctx)
    try:
        ddp_model.register_comm_hook(state, hardened_hook)
    except BaseException:
        state.close()
        raise
    # DDP's Python record of the hook (the C++ reducer keeps it, inert after close)
    state.handles.append(Appended(ddp_model, "_comm_hooks", ddp_model._comm_hooks[-1]))
    required = checks.required_gradient_names(ddp_model.module)
    for name, p in named:
        if required is not None and name in required and p.requires_grad:
            state.required.add(id(p))
            state.handles.append(p.register_hook(_presence_hook(state.present, id(p))))
    watch = state.averaging = AveragingWatch(ddp_model, state.synchronized, state.progress,
                                             state.global_ranks[state.rank],
                                             functools.partial(_unissued_step, state, ddp_model))

    def wrapper_forward(module, args) -> None:
        state.open_forward()

    def module_pre_forward(module, args) -> None:
        state.open_module_forward()
        watch.module_pre_forward()

    state.complete_unissued = functools.partial(_complete_unissued, state, ddp_model)
    state.handles.append(ddp_model.register_forward_pre_hook(eager(wrapper_forward)))
    state.handles.append(ddp_model.module.register_forward_pre_hook(eager(module_pre_forward)))
    if state.policy.pre_scales:  # opt-in pre-scale: refused under a GradScaler
        state.handles.append(register_optimizer_step_pre_hook(
            refuse_grad_scaler(state.policy, cfg.scale)))
    state.handles.append(ddp_model.module.register_forward_hook(eager(watch.module_forward)))
    return state

