"""``hardened``: stock DDP plus one comm hook that makes every bucket's sync verifiable.

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

Two ways to use it, the same checks in both::

    ddp = DistributedDataParallel(model)
    state = harden(ddp)                       # 1. no protocol: train as usual
    for batch in loader:
        loss_fn(ddp(batch)).backward()        #    raises on any disagreement
        opt.step(); opt.zero_grad()

    for step, batch in enumerate(loader):     # 2. explicit: name the step, learn the verdict
        state.begin_step(step)
        loss_fn(ddp(batch)).backward()
        if state.finish_step(step):           #    False: every rank skips this step
            opt.step()
        opt.zero_grad()

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
import os
import time
import warnings

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.optim.optimizer import register_optimizer_step_pre_hook

from openclaw_ref.sync import checks
from openclaw_ref.sync.averaged import AveragingWatch
from openclaw_ref.sync.base import Guard, RankInfo, SyncConfig, SyncStrategy, harden_defaults
from openclaw_ref.sync.control_counts_write import write_counts
from openclaw_ref.sync.control_layout import joined_slot, unissued_slot
from openclaw_ref.sync.ddp import wrap_ddp
from openclaw_ref.sync.fsdp_guard import FSDPGuard, FSDPModule, harden_fsdp
from openclaw_ref.sync.harden_state import HardenState
from openclaw_ref.sync.ledger import BucketRecord
from openclaw_ref.sync.precision import (
    ScalePolicy,
    divide,
    finite_sum,
    from_wire,
    refuse_grad_scaler,
    to_wire,
)
from openclaw_ref.sync.step_guard import StepGuard
from openclaw_ref.sync.step_setup import Unset, refuse_unsupported, register_wire
from openclaw_ref.sync.target import HARDENED_MARK, bucket_sizes, validate_target
from openclaw_ref.sync.watchdog import Watchdog, exit_fatal, namespace_for


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
        state._wires.pop(index, None)  # a last bucket before DDP's rebuild keeps no buffer
    else:
        wire = state.wire_buffer(index, grads, _block_elements(state, grads) if last else 0)
        to_wire(grads, wire[:n], state.world_size, exponent, state.policy.loss_scaler)
    record = BucketRecord(index, names, n, None, wire[:n])
    state._records.append(record)
    if last:
        state.attach_block(wire[n:])
        state.close_step()
    if state.on_cuda:
        state._device_marks.append((index, state.device_mark()))
    work = dist.all_reduce(wire, group=state.group, async_op=True)
    if state.watchdog is not None:
        state.watchdog.issued(state.clock, index, work)
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
    state.block.add(joined_slot(), None)
    state.shadow_buckets += 1
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


def _unissued_allreduce(state: HardenState, bucket) -> None:
    """Send zeros for a bucket of this step that this rank's DDP never issued (``bucket``: one
    of the reducer's zero-filled buckets), in the wire format the other ranks used for it, with
    a slot that says so (``control_layout.unissued_slot``); the last one carries the step's
    control block. The others are waiting inside these allreduces: they complete, and every
    rank reads the same block and raises the same ``MissingGradient`` (``control.verify``)."""
    grads = bucket.buffer()
    n, index, last = grads.numel(), bucket.index(), bucket.is_last()
    digest, names = state.membership(bucket)
    exponent = state.policy.exponent_for(state.rank)
    state.block.add(unissued_slot(state.slot(index, digest, exponent, 0.0, None)),
                    torch.zeros((), dtype=torch.float32))
    if _in_place(state, grads, last, exponent):
        wire = grads
    else:
        wire = state.wire_buffer(index, grads, _block_elements(state, grads) if last else 0)
        wire[:n].zero_()
    record = BucketRecord(index, names, n, None, wire[:n])
    state._records.append(record)
    if last:
        state.attach_block(wire[n:])
    work = dist.all_reduce(wire, group=state.group, async_op=True)
    if state.watchdog is not None:
        state.watchdog.issued(state.clock, index, work)
    record.done = work.get_future()


def _complete_unissued(state: HardenState, ddp_model: DDP) -> None:
    """The step's buckets this rank's DDP never issued (DDP issues them in index order, so the
    issued ones are a prefix), sent as zeros by ``_unissued_allreduce``."""
    issued = {r.index for r in state._records}
    for bucket in ddp_model.reducer._get_zeros_like_grad_buckets():
        if bucket.index() not in issued:
            _unissued_allreduce(state, bucket)


def _unissued_step(state: HardenState, ddp_model: DDP) -> None:
    """A backward in which this rank's DDP issued no bucket (it stopped before bucket 0): the
    step's buckets go as zeros marked "never issued", and the step is judged — the same
    ``MissingGradient`` on every rank (``averaged.AveragingWatch``)."""
    _complete_unissued(state, ddp_model)
    state._settle()


def _presence_hook(present: set[int], key: int):
    """A tensor hook recording that parameter ``key`` got a local gradient this step."""
    return lambda grad: present.add(key)


def harden(ddp_model: DDP | FSDPModule, cfg: SyncConfig | None = None,
           ctx: RankInfo | None = None, *, check_construction: bool = True,
           optimizer: torch.optim.Optimizer | None = None) -> HardenState | StepGuard | FSDPGuard:
    """Make a DDP model's gradient sync verifiable; returns the state (see module docstring).
    An FSDP2 (``fully_shard``) root module gets ``fsdp_guard``'s guard (``optimizer``: its own).

    ``cfg.guard`` picks how: ``step`` (the default, ``step_guard``: DDP's own C++ reduction and
    one small exchange per step) or ``bucket`` (this module's per-bucket comm hook: the
    forensic mode, and the only one that pre-scales an fp16 wire or sends bf16). Everything
    runs on ``ddp_model.process_group``. ``ctx`` (any ``RankInfo``, e.g. our launcher's) gives
    the store for the watchdog and the way to report a hang from its thread; without it the
    default store and ``os._exit`` are used. ``check_construction=False`` skips the cross-rank
    parameter check (tests use it to show that the in-band membership digest alone still
    catches a swapped registration). Raises ``BadInput`` before registering anything and before
    any collective when the model cannot be hardened: a comm hook already registered (Python or
    C++ built-in), a process group with no backend for the gradients' device, a wire dtype the
    backend cannot reduce, a wire or pre-scale the chosen guard cannot send; and from the first
    optimizer step a ``torch.amp.GradScaler`` runs over a pre-scaled fp16 wire
    (``precision.refuse_grad_scaler``).

    ``state.close()`` removes what this added (forward hooks, gradient-presence hooks, the
    optimizer step pre-hooks, the watchdog thread) on the rank it runs on. Under ``bucket``
    DDP cannot unregister the comm hook: after ``close()`` it is inert — a plain allreduce
    average like PyTorch's ``allreduce_hook``, no control block, no check — so close every
    rank of the group. Under ``step`` the wire is DDP's own and stays as it was.

    After an error. A ``ConsistencyError`` (or a failed collective) is raised from inside
    DDP's backward, which leaves DDP's reducer mid-iteration: the next backward of this DDP
    model fails on DDP's own internal assert. The model cannot be used again. Close the state
    and drop the model (its reducer's hooks on the parameters go with it), then either build a
    new ``DistributedDataParallel`` around the same module (its parameters are broadcast from
    rank 0 again) and harden that, or restore a checkpoint — on every rank.
    """
    cfg = cfg or harden_defaults()
    if isinstance(ddp_model, FSDPModule):
        return harden_fsdp(ddp_model, cfg, check_construction, optimizer,
                           lambda guard: _watchdog(guard, cfg, ctx))
    backend = validate_target(ddp_model, cfg)
    if cfg.guard is Guard.STEP:
        refuse_unsupported(cfg)
    group = ddp_model.process_group
    named = list(ddp_model.module.named_parameters())
    if check_construction:
        checks.construction_check(named, group=group, layout=bucket_sizes(ddp_model))
    synchronized = checks.synchronized_parameters(ddp_model)
    if cfg.guard is Guard.STEP:
        state = StepGuard(ddp_model, cfg, named, synchronized)
        state.watchdog = _watchdog(state, cfg, ctx)
        register_wire(ddp_model, cfg)
        state.install(checks.required_gradient_names(ddp_model.module))
    else:
        state = _harden_buckets(ddp_model, cfg, ctx, named, synchronized)
    if check_construction:
        state.ledger.count_check(True)
    setattr(ddp_model, HARDENED_MARK, state)
    state.handles.append(Unset(ddp_model, HARDENED_MARK))
    state.handles.append(register_optimizer_step_pre_hook(state.before_optimizer_step))
    if backend == "nccl" and os.environ.get(
            "TORCH_NCCL_ASYNC_ERROR_HANDLING") is None:
        warnings.warn("TORCH_NCCL_ASYNC_ERROR_HANDLING was not set before the NCCL process group "
                      "was created; a failed collective may hang instead of aborting",
                      stacklevel=2)
    return state


def _watchdog(state: HardenState | StepGuard | FSDPGuard, cfg: SyncConfig, ctx: RankInfo | None
              ) -> Watchdog:
    """The state's hang watchdog, on ``ctx``'s store (the default store without one)."""
    store = ctx.store if ctx is not None else dist.distributed_c10d._get_default_store()
    report = ctx.report_fatal if ctx is not None else exit_fatal
    global_rank = state.global_ranks[state.rank]
    return Watchdog(store, state.rank, state.world_size, cfg.watchdog_s,
                    namespace_for(store, global_rank, group_ranks=state.global_ranks),
                    on_timeout=report, global_ranks=state.global_ranks,
                    action=cfg.watchdog_action, events=state.events)


def _harden_buckets(ddp_model: DDP, cfg: SyncConfig, ctx: RankInfo | None,
                    named: list[tuple[str, nn.Parameter]],
                    synchronized: list[tuple[str, nn.Parameter]]) -> HardenState:
    """``Guard.BUCKET``: register ``hardened_hook`` and what it needs (module docstring)."""
    state = HardenState(cfg, ddp_model.process_group, named, synchronized)
    state.watchdog = _watchdog(state, cfg, ctx)
    try:
        ddp_model.register_comm_hook(state, hardened_hook)
    except BaseException:
        state.close()
        raise
    required = checks.required_gradient_names(ddp_model.module)
    for name, p in named:
        if required is not None and name in required and p.requires_grad:
            state.required.add(id(p))
            state.handles.append(p.register_hook(_presence_hook(state.present, id(p))))
    watch = state.averaging = AveragingWatch(ddp_model, state.synchronized, state.progress,
                                             state.global_ranks[state.rank],
                                             functools.partial(_unissued_step, state, ddp_model))

    def wrapper_forward(module, args) -> None:
        watch.wrapper_forward()
        state.forward_started()

    state.complete_unissued = functools.partial(_complete_unissued, state, ddp_model)
    state.handles.append(ddp_model.register_forward_pre_hook(wrapper_forward))
    if state.policy.pre_scales:  # opt-in pre-scale: refused under a GradScaler
        state.handles.append(register_optimizer_step_pre_hook(
            refuse_grad_scaler(state.policy, cfg.scale)))
    state.handles.append(ddp_model.module.register_forward_hook(watch.module_forward))
    return state


class Hardened(SyncStrategy):
    """``hardened``: DDP (same buckets, same collectives) + ``harden``."""

    name = "hardened"

    def wrap(self, model: nn.Module, ctx: RankInfo) -> nn.Module:
        self.ddp = wrap_ddp(model, ctx, self.cfg)
        self.state = harden(self.ddp, self.cfg, ctx)
        self.events = self.state.events
        return self.ddp

    def begin_step(self, step: int) -> None:
        self.state.begin_step(step)

    def finish_step(self, step: int) -> bool:
        return self.state.finish_step(step)

    def step_metrics(self) -> dict:
        return self.state.step_metrics()

    def bucket_layout(self) -> list[tuple[int, list[str]]]:
        """(bucket index, member names) of the last verified step, as this rank saw them."""
        return self.state.last_layout

    def summary(self) -> dict:
        return self.state.summary()

    def scale_policy(self) -> ScalePolicy | None:
        """The pre-scale policy of the per-bucket guard (the fault injector's handle on one
        rank's exponent); None under the step guard, which never pre-scales."""
        if not hasattr(self, "state") or self.cfg.guard is Guard.STEP:
            return None
        return self.state.policy

    def close(self, verify: bool = True) -> None:
        """Every replica slice compared once (the guard's close-time check), then closed."""
        if hasattr(self, "state"):
            self.state.close(verify)
