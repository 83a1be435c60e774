"""``hardened``: stock DDP plus one comm hook that makes every bucket's sync verifiable.

``harden(ddp_model, cfg)`` works on any ``DistributedDataParallel`` model — on its own process
group (a sub-group or a DeviceMesh dimension included), under our launcher, under ``torchrun``,
inside Lightning. At construction it checks that parameter names, shapes, dtypes and order agree
on every rank of the group, starts a watchdog, and registers ``hardened_hook``. Per bucket, the
hook

  1. sums this rank's own gradients (NaN or ±inf iff one of them is: the local non-finite
     flag, never read on the host here);
  2. divides them by the world size in place and allreduces DDP's own bucket, exactly as
     PyTorch's ``allreduce_hook`` does — or, for the last bucket, an fp16/bf16 wire or a
     pre-scale, writes ``g · 2^e / W`` into the bucket's wire buffer in one pass (divide before
     the rounding); where the wire can overflow, the reduced wire is summed on completion and
     the unscaled result written back into DDP's bucket;
  3. appends its slot for the bucket — clock, bucket index, membership digest, scale exponent,
     first absent required gradient, local flag, ready time — to the step's control block
     (``control.StepBlock``: Python integers, encoded once per bucket where they cannot change);
  4. hands the allreduce's ``Work`` to the watchdog, which polls it (gloo and NCCL alike).
The step's last bucket goes through its wire buffer with the step's control block (B × W × 22
values) at its tail: exactly the collectives stock DDP issues, and per bucket one pass (the
sum) more than PyTorch's ``allreduce_hook``.

At the end of every backward (a callback queued on the autograd engine, as DDP queues its own)
the step is judged by ``ledger.Ledger.settle``: every control block is checked on the device
and read with one host sync; ``ClockMismatch`` / ``BucketMisalignment`` / ``ScaleMismatch`` /
``MissingGradient`` / ``NonFiniteGradient`` are raised identically on every rank, from
``backward()``. A local NaN/inf is fatal under ``nonfinite="raise"``; under ``skip`` (the
default) it passes through the sum as in stock DDP, so every rank holds the same non-finite
gradients and a loss scaler skips the step together; the event names the ranks.

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

``DDP.join()`` is supported: a joined rank's shadow allreduces carry a "joined" slot that
abstains from every comparison. The replica check (``replica_check_every``) is a collective in
the forward and must not be combined with ``join()``.
"""

from __future__ import annotations

import os
import time
import warnings

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from openclaw_ref.sync import checks
from openclaw_ref.sync.base import RankInfo, SyncConfig, SyncStrategy
from openclaw_ref.sync.control import (
    StepBlock,
    assemble_slot,
    block_size,
    clock_chunks,
    joined_slot,
    membership_digest,
    slot_middle,
)
from openclaw_ref.sync.ddp import wrap_ddp
from openclaw_ref.sync.errors import ConsistencyError
from openclaw_ref.sync.ledger import BucketRecord, Ledger
from openclaw_ref.sync.precision import (
    ScalePolicy,
    finite_sum,
    from_wire,
    to_wire,
)
from openclaw_ref.sync.target import bucket_sizes, validate_target
from openclaw_ref.sync.watchdog import Watchdog, exit_fatal, namespace_for


def _in_backward() -> bool:
    """True inside an autograd backward; DDP's join shadow calls the hook outside of one."""
    return torch._C._current_graph_task_id() != -1


class HardenState:
    """Everything the hook and the step check share (one per DDP model).

    Step lifecycle: the first bucket of a backward opens a step and queues ``_settle`` at the
    end of that backward; ``_settle`` verifies the step, resets the per-step state (presence,
    ready-time origin) and advances the clock. ``begin_step(n)`` only names the clock."""

    def __init__(self, cfg: SyncConfig, group, named: list[tuple[str, nn.Parameter]],
                 synchronized: list[tuple[str, nn.Parameter]] | None = None) -> None:
        self.cfg = cfg
        self.group = group
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)
        self.global_ranks = dist.get_process_group_ranks(group)
        self.policy = ScalePolicy.from_config(cfg)
        self.named_parameters = named
        # what the replica check compares: the parameters DDP keeps equal (not those DDP was
        # told to ignore)
        self.synchronized = named if synchronized is None else synchronized
        self.names = {id(p): n for n, p in named}
        self.watchdog: Watchdog | None = None
        self.ledger = Ledger(self.world_size, self.policy, rank=self.rank,
                             global_ranks=self.global_ranks,
                             raise_nonfinite=cfg.nonfinite == "raise")
        self.events = self.ledger.events
        self.required: set[int] = set()  # ids of parameters that must get a gradient every step
        self.present: set[int] = set()  # required parameters that got a local gradient
        self.clock = 0
        self.step_t0 = time.perf_counter()
        self.shadow_buckets = 0  # buckets this rank sent as a joined rank (DDP.join())
        self._records: list[BucketRecord] = []
        self._first_issue: float | None = None
        self._verdict: bool | None = None  # of the last settled step, until finish_step reads it
        self.last_layout: list[tuple[int, list[str]]] = []  # (bucket, members) last settled
        self._replica_checked_at = -1
        self.replica_digest = checks.ReplicaDigest()  # its tables and scratch reused per check
        self._members: dict[tuple[int, ...], tuple[int, list[str]]] = {}
        self._wires: dict[int, torch.Tensor] = {}  # only for wires that differ from the grads
        self.block = StepBlock(self.rank, self.world_size)
        self._step_block: torch.Tensor | None = None  # its rows, sent with the last bucket
        self._middles: dict[tuple[int, int, int], list[int]] = {}
        self._clock_chunks: tuple[int, list[int]] = (-1, [])
        # CUDA only: ready times from events on the current stream (host clocks there measure
        # kernel launches, not when the gradients were ready); read after the step's host sync
        self.on_cuda = any(p.is_cuda for _, p in named)
        self._device_t0 = None
        self._device_marks: list[tuple[int, object]] = []

    # called by the hook -------------------------------------------------------------------
    def membership(self, bucket: dist.GradBucket) -> tuple[int, list[str]]:
        """Digest and names of the bucket's members, cached by parameter identity: DDP hands
        the same Parameter objects every step, and any change of membership changes the key."""
        params = bucket.parameters()
        key = tuple(id(p) for p in params)
        got = self._members.get(key)
        if got is None:
            names = [self.names.get(id(p), f"<unnamed #{i}>") for i, p in enumerate(params)]
            members = [(n, tuple(p.shape), str(p.dtype), 0, p.numel())
                       for n, p in zip(names, params)]
            got = self._members[key] = (membership_digest(members), names)
        return got

    def first_absent(self, bucket: dist.GradBucket) -> int | None:
        """Member index of the first required parameter with no local gradient this step.

        Presence comes from tensor hooks, which fire before the gradient is accumulated and so
        before DDP can mark the bucket ready; DDP zero-fills an absent gradient in the bucket,
        which is why the buffer itself cannot tell."""
        if not self.required:
            return None
        for i, p in enumerate(bucket.parameters()):
            if id(p) in self.required and id(p) not in self.present:
                return i
        return None

    def wire_buffer(self, index: int, grads: torch.Tensor, extra: int = 0) -> torch.Tensor:
        """A reused buffer per bucket when the bucket cannot be reduced in place: an fp16/bf16
        wire or a pre-scale, or the last bucket, which carries the step's control block
        (``extra`` elements) at its tail. DDP takes the result out before the next step, so
        the previous step's reduced values are never needed again."""
        dtype = self.policy.dtype_for(grads.dtype)
        size = grads.numel() + extra
        buf = self._wires.get(index)
        if buf is None or buf.numel() != size or buf.dtype != dtype or buf.device != grads.device:
            buf = self._wires[index] = torch.empty(size, dtype=dtype, device=grads.device)
        return buf

    def slot(self, index: int, digest: int, exponent: int, ready_s: float,
             absent: int | None) -> list[int]:
        """This rank's slot for the bucket, from pieces encoded once per bucket and per step."""
        key = (index, digest, exponent)
        middle = self._middles.get(key)
        if middle is None:
            middle = self._middles[key] = slot_middle(bucket=index, digest=digest,
                                                      scale_exp=exponent)
        if self._clock_chunks[0] != self.clock:
            self._clock_chunks = (self.clock, clock_chunks(self.clock))
        return assemble_slot(self._clock_chunks[1], middle, ready_s=ready_s, absent=absent)

    def attach_block(self, block: torch.Tensor) -> None:
        """Write the step's slots into ``block`` (the last bucket's wire tail) and point every
        record of the step at its row."""
        rows = self._step_block = block.view(len(self.block), -1)
        self.block.write(block)
        for record, row in zip(self._records, rows):
            record.block = row

    def open_step(self, t: float) -> None:
        """The first bucket of a backward: verify the step when that backward ends."""
        if self._first_issue is not None:
            return
        self._first_issue = t
        torch.autograd.Variable._execution_engine.queue_callback(self._settle)

    # the step -----------------------------------------------------------------------------
    def device_mark(self):
        """A timing event recorded now on the current CUDA stream (None off CUDA)."""
        if not self.on_cuda:
            return None
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def _start_clock(self) -> None:
        self.step_t0 = time.perf_counter()
        self._device_t0 = self.device_mark()
        self._device_marks = []

    def forward_started(self) -> None:
        """Forward pre-hook of the DDP model: the ready-time origin of the next step."""
        if self._first_issue is None:
            self._start_clock()
            self._maybe_check_replicas()

    def begin_step(self, step: int) -> None:
        """Name the step (the clock every rank must agree on); every K steps compare replicas."""
        self.clock = step
        self._verdict = None
        self._start_clock()
        self._maybe_check_replicas()

    def finish_step(self, step: int | None = None) -> bool:
        """The verdict of the step the last backward settled: False = every rank skips this
        optimizer step (a non-finite sum). True when no bucket was reduced (``no_sync``)."""
        if self._records:  # a backward whose end-of-backward callback could not run
            self._settle()
        verdict, self._verdict = self._verdict, None
        return True if verdict is None else verdict

    def _settle(self) -> None:
        t = time.perf_counter()
        records, self._records = self._records, []
        exposed = (t - self._first_issue) * 1e3 if self._first_issue is not None else 0.0
        step = self.clock
        self.last_layout = [(r.index, list(r.params)) for r in records]
        self._first_issue = None
        self.present.clear()
        self.clock += 1
        if records and records[-1].block is None:
            self.block.clear()
            raise RuntimeError(
                f"step {step}: DDP never reduced this backward's last bucket, so its control "
                "block was not sent (a parameter without a gradient under "
                "find_unused_parameters=False?)")
        try:
            blocks, self._step_block = self._step_block, None
            self._verdict = self.ledger.settle(step, records, sync_ms=exposed, verify_started=t,
                                               blocks=blocks)
        finally:
            if self.watchdog is not None:
                self.watchdog.settled(step)
        if self._device_t0 is not None and self._device_marks:  # complete: settle synced
            self.ledger.last["device_ready_ms"] = {
                index: self._device_t0.elapsed_time(event) for index, event in self._device_marks}
            self._device_marks = []

    def _maybe_check_replicas(self) -> None:
        k = self.cfg.replica_check_every
        if not k or self.clock % k or self._replica_checked_at == self.clock:
            return
        self._replica_checked_at = self.clock
        self.ledger.replica_checks += 1
        try:
            checks.replica_check(self.synchronized, step=self.clock, group=self.group,
                                 digest=self.replica_digest)
        except ConsistencyError as exc:
            self.ledger.count_check(False)
            raise exc.renumbered(self.global_ranks) from None
        self.ledger.count_check(True)

    def step_metrics(self) -> dict:
        return dict(self.ledger.last)

    def summary(self) -> dict:
        return {**self.ledger.summary(), "wire": self.cfg.wire, "nonfinite": self.cfg.nonfinite,
                "scale_mode": "auto" if self.policy.auto else "fixed",
                "shadow_buckets": self.shadow_buckets}

    def close(self) -> None:
        if self.watchdog is not None:
            self.watchdog.close()


def hardened_hook(state: HardenState, bucket):  # no annotations: DDP rejects string ones
    """The DDP comm hook (see the module docstring); one allreduce per bucket, like DDP's own,
    the last one carrying the step's control block. ``bucket`` is a ``dist.GradBucket``;
    returns a ``Future[Tensor]`` of the bucket's size."""
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
    in_place = (not last and exponent == 0
                and state.policy.dtype_for(grads.dtype) == grads.dtype)
    if in_place:  # as PyTorch's allreduce_hook: divide and reduce DDP's own bucket
        wire = grads.div_(state.world_size)
        state._wires.pop(index, None)  # a last bucket before DDP's rebuild keeps no buffer
    else:
        wire = state.wire_buffer(index, grads, block_size(state.world_size) * len(state.block)
                                 if last else 0)
        to_wire(grads, wire[:n], state.world_size, exponent)
    record = BucketRecord(index, names, n, None, wire[:n])
    state._records.append(record)
    if last:
        state.attach_block(wire[n:])
    if state.on_cuda:
        state._device_marks.append((index, state.device_mark()))
    work = dist.all_reduce(wire, group=state.group, async_op=True)
    if state.watchdog is not None:
        state.watchdog.issued(state.clock, index, work)
    if in_place:
        record.done = work.get_future().then(lambda fut: fut.value()[0])
        return record.done
    can_overflow = exponent != 0 or wire.dtype != grads.dtype

    def unpack(_: torch.futures.Future) -> torch.Tensor:
        if can_overflow:  # the wire itself may overflow under 2^e or in a narrower dtype
            record.flag = finite_sum(wire[:n])
        return from_wire(wire[:n], exponent, grads.dtype,
                         out=grads if can_overflow else None)

    record.done = work.get_future().then(unpack)
    return record.done


def _shadow_allreduce(state: HardenState, bucket):
    """A joined rank's (``DDP.join()``) zero bucket, matching the active ranks' allreduce —
    with the last bucket, their control block too: "joined" slots abstain from their checks.
    DDP does not use the result."""
    grads = bucket.buffer()
    n, last = grads.numel(), bucket.is_last()
    exponent = state.policy.exponent_for(state.rank)
    state.block.add(joined_slot(), None)
    state.shadow_buckets += 1
    if not last and exponent == 0 and state.policy.dtype_for(grads.dtype) == grads.dtype:
        wire = grads.zero_()
    else:
        wire = state.wire_buffer(bucket.index(), grads, block_size(state.world_size)
                                 * len(state.block) if last else 0)
        wire[:n].zero_()
        if last:
            state.block.write(wire[n:])
    fut = dist.all_reduce(wire, group=state.group, async_op=True).get_future()
    return fut.then(lambda _: grads)


def harden(ddp_model: DDP, cfg: SyncConfig | None = None, ctx: RankInfo | None = None, *,
           check_construction: bool = True) -> HardenState:
    """Make a DDP model's gradient sync verifiable; returns the state (see module docstring).

    Everything runs on ``ddp_model.process_group``. ``ctx`` (any ``RankInfo``, e.g. our
    launcher's) gives the store for the watchdog and the way to report a hang from its thread;
    without it the default store and ``os._exit`` are used. ``check_construction=False`` skips
    the cross-rank parameter check (tests use it to show that the in-band membership digest
    alone still catches a swapped registration). Raises ``BadInput`` before registering
    anything when the model cannot be hardened.
    """
    cfg = cfg or SyncConfig(name="hardened")
    validate_target(ddp_model, cfg)
    group = ddp_model.process_group
    named = list(ddp_model.module.named_parameters())
    if check_construction:
        checks.construction_check(named, group=group, layout=bucket_sizes(ddp_model))
    state = HardenState(cfg, group, named, checks.synchronized_parameters(ddp_model))
    if check_construction:
        state.ledger.count_check(True)
    store = ctx.store if ctx is not None else dist.distributed_c10d._get_default_store()
    report = ctx.report_fatal if ctx is not None else exit_fatal
    global_rank = state.global_ranks[state.rank]
    state.watchdog = Watchdog(store, state.rank, state.world_size, cfg.watchdog_s,
                              namespace_for(store, global_rank, group_ranks=state.global_ranks),
                              on_timeout=report, global_ranks=state.global_ranks)
    try:
        ddp_model.register_comm_hook(state, hardened_hook)
    except BaseException:
        state.close()
        raise
    required = checks.required_gradient_names(ddp_model.module)
    for name, p in named:
        if required is not None and name in required and p.requires_grad:
            state.required.add(id(p))
            p.register_hook(lambda grad, key=id(p): state.present.add(key))  # noqa: B008
    ddp_model.register_forward_pre_hook(lambda module, args: state.forward_started())
    if dist.get_backend(group) == "nccl" and os.environ.get(
            "TORCH_NCCL_ASYNC_ERROR_HANDLING") is None:
        warnings.warn(  # noqa: B028
            "TORCH_NCCL_ASYNC_ERROR_HANDLING was not set before the NCCL process group "
            "was created; a failed collective may hang instead of aborting")
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
        return self.state.policy if hasattr(self, "state") else None

    def close(self) -> None:
        if hasattr(self, "state"):
            self.state.close()
