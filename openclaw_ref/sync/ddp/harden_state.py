"""``HardenState``: the per-bucket guard's state (``Guard.BUCKET``), one per DDP model.

The hook path itself (``bucket_guard.hardened_hook``) stays small and reads straight through;
the state it calls into lives here: the step lifecycle (the clock every rank must agree on, the
ready-time origin, the end-of-backward settle that hands the step to ``ledger.Ledger``), the
per-bucket caches the hook reuses from step to step (membership digests, wire buffers, the
encoded pieces of its control-block slots), the replica slices digested into the step block,
and the statistics reported per step and per run. Nothing here issues a collective except the
gather of a step whose counted block fails its check (``ledger.CountedStep``).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn

from openclaw_ref.sync.base import SyncConfig
from openclaw_ref.sync.ddp.ddp_guard import DDPGuard
from openclaw_ref.sync.evidence.averaged import AveragingWatch
from openclaw_ref.sync.evidence.control_counts import CountLayout
from openclaw_ref.sync.evidence.control_counts_write import write_counts
from openclaw_ref.sync.evidence.control_layout import (
    StepBlock,
    assemble_slot,
    clock_chunks,
    joined_slot,
    membership_digest,
    slot_middle,
)
from openclaw_ref.sync.evidence.ledger import BucketRecord, CountedStep, gather_step_rows
from openclaw_ref.sync.evidence.precision import nonfinite_flags


class HardenState(DDPGuard):
    """Everything the hook and the step check share (one per DDP model; the surface:
    ``GuardBase``).

    Step lifecycle: the first bucket of a backward opens a step; the last one (``is_last()``)
    queues ``settle_step`` at the end of the graph task it fires in; ``settle_step`` verifies
    the step, resets the per-step state (presence, ready-time origin) and advances the clock.
    ``begin_step(n)`` only names the clock."""

    def __init__(self, cfg: SyncConfig, group, named: list[tuple[str, nn.Parameter]],
                 synchronized: list[tuple[str, nn.Parameter]] | None = None) -> None:
        super().__init__(cfg, group, named, named if synchronized is None else synchronized)
        self.tracked = named
        self.names = {id(p): n for n, p in named}
        self.required: set[int] = set()  # ids of parameters that must get a gradient every step
        self.present: set[int] = set()  # required parameters that got a local gradient
        self.shadow_buckets = 0  # buckets this rank sent as a joined rank (DDP.join())
        self._records: list[BucketRecord] = []
        self._first_issue: float | None = None
        self.last_layout: list[tuple[int, list[str]]] = []  # (bucket, members) last settled
        self._members: dict[tuple[int, ...], tuple[int, list[str]]] = {}
        self._wires: dict[int, torch.Tensor] = {}  # only for wires that differ from the grads
        self.block = StepBlock(self.rank, self.world_size)
        self._step_block: CountedStep | None = None  # sent with the last bucket
        self._sent: tuple[list[list[int]], torch.Tensor | list[bool] | None] | None = None
        self._middles: dict[tuple[int, int, int], list[int]] = {}
        self._clock_chunks: tuple[int, list[int]] = (-1, [])
        self._device_t0 = None
        self._device_marks: list[tuple[int, object]] = []
        self.averaging: AveragingWatch | None = None  # were the gradients averaged? (harden())
        # sends the buckets this rank's DDP never issued this step (harden())
        self.complete_unissued: Callable[[], None] | None = None

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

    def block_layout(self, wire_dtype: torch.dtype) -> CountLayout:
        return CountLayout(self.world_size, wire_dtype)

    def attach_block(self, block: torch.Tensor) -> None:
        """Write this rank's counts for the step (its slots, NaN flags and replica digest:
        ``control_counts``) into ``block`` (the last bucket's wire tail); the slots are kept
        for a failure gather. The step's block being set is what says DDP issued its last
        bucket here (``settle_step``)."""
        layout = self.block_layout(block.dtype)
        slots = self.block.slots
        flags = nonfinite_flags(self.block.flags, each=True) if self.block.flags else None
        replica = None
        if self.replicas.enabled:
            replica = self.replicas.digest_slice(self.clock)
            self.ledger.count_replica_slice()
        write_counts(block, layout, self.rank, slots, flags, replica)
        self.block.clear()
        self._sent = (slots, flags)
        self._step_block = CountedStep(block, layout, self._gather, self._replica_error)

    def _gather(self) -> list[list[int]]:
        """Every rank's slots of the step and replica row (``ledger.gather_step_rows``)."""
        slots, flags = self._sent if self._sent is not None else (None, None)
        assert slots is not None, "a counted step always kept its slots"
        return gather_step_rows(self.group, slots, flags, self.replicas)

    def _replica_error(self, rows: list[list[int]], active: list[int]):
        return self.replicas.divergence(rows, active, step=self.clock - 1)

    def reduce(self, record: BucketRecord, wire: torch.Tensor, last: bool, *,
               by_ddp: bool = True):
        """Issue one bucket's allreduce of ``wire`` (its gradients, then at the last bucket the
        step's counts: ``attach_block``), keeping its ``record`` for the step's verdict, and hand
        the ``Work`` to the watchdog. ``by_ddp``: a bucket DDP issued (the hook), whose last
        queues the step's verdict (``close_step``) and which, on CUDA, marks its ready time;
        else one sent as zeros for a bucket DDP never issued."""
        self._records.append(record)
        if last:
            self.attach_block(wire[record.elements:])
            if by_ddp:
                self.close_step()
        if by_ddp and self.on_cuda:
            self._device_marks.append((record.index, self.device_mark()))
        work = dist.all_reduce(wire, group=self.group, async_op=True)
        if self.watchdog is not None:
            self.watchdog.issued(self.clock, record.index, work)
        return work

    def drop_wire(self, index: int) -> None:
        """Bucket ``index`` is reduced in DDP's own buffer now: no wire buffer is kept for it
        (a last bucket before DDP's rebuild)."""
        self._wires.pop(index, None)

    def add_joined_slot(self) -> None:
        """A bucket this rank sends as a joined rank (``DDP.join()``): a slot that abstains."""
        self.block.add(joined_slot(), None)
        self.shadow_buckets += 1

    def issued_buckets(self) -> set[int]:
        """The buckets of this step issued so far."""
        return {r.index for r in self._records}

    def step_layout(self) -> list[tuple[int, list[str]]]:
        """(bucket, members) of this step's buckets issued so far (before its verdict)."""
        return [(r.index, list(r.params)) for r in self._records]

    def open_step(self, t: float) -> None:
        """A bucket of a backward: the first one starts the step's exposed-time clock."""
        if self._first_issue is None:
            self._first_issue = t

    def close_step(self) -> None:
        """DDP's last bucket was issued, so every bucket of the step is in flight: verify the
        step when the current autograd graph task ends, where DDP queues its own finalize.

        Not at the first bucket: that one may fire inside a nested graph task (a reentrant
        activation checkpoint runs its own backward) that ends before the last bucket is
        issued, whereas DDP issues its buckets in index order, so ``is_last()`` comes last
        whatever task it fires in.

        Deferred (``SyncConfig.verdict_at``): nothing is queued; the step is verified at the
        next ``before_optimizer_step``, ``finish_step``, ``begin_step`` or forward."""
        if not self.deferred:
            torch.autograd.Variable._execution_engine.queue_callback(self.settle_step)

    def progress(self) -> tuple[int, int]:
        """(clock, buckets issued and not yet settled): changes whenever a bucket is issued."""
        return self.clock, len(self._records)

    # the step -----------------------------------------------------------------------------
    def device_mark(self):
        """A timing event recorded now on the current CUDA stream (None off CUDA)."""
        if not self.on_cuda:
            return None
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def _start_clock(self) -> None:
        self.ledger.new_step()
        self.step_t0 = time.perf_counter()
        self._device_t0 = self.device_mark()
        self._device_marks = []

    def _settle(self) -> None:
        """A step with buckets issued is judged (also a backward that never issued DDP's
        last bucket)."""
        if self._records:
            self.settle_step()

    def settle_step(self) -> None:
        if self._records and self._step_block is None and self.complete_unissued:
            # DDP never issued its last bucket here: the other ranks wait inside the first
            # bucket it skipped. Send the rest as zeros marked "never issued", so that every
            # rank reads the same block and raises the same MissingGradient, this one included.
            self.complete_unissued()
        t = time.perf_counter()
        records, self._records = self._records, []
        exposed = (t - self._first_issue) * 1e3 if self._first_issue is not None else 0.0
        step = self.clock
        self.last_layout = [(r.index, list(r.params)) for r in records]
        self._first_issue = None
        self.present.clear()
        self.clock += 1
        try:
            blocks, self._step_block = self._step_block, None
            self._verdict = self.ledger.settle(step, records, sync_ms=exposed, verify_started=t,
                                               counted=blocks)
        except Exception as exc:  # a failed collective: the watchdog's diagnosis, if it has one
            failed = _failed_bucket(records) if isinstance(exc, RuntimeError) else None
            if failed is None:
                self._failed(exc)
                raise
            self._collective_failed(exc, step, cause=failed[1], bucket=failed[0])
        finally:
            if self.watchdog is not None:
                self.watchdog.settled(step)
        if self._device_t0 is not None and self._device_marks:  # complete: settle synced
            self.ledger.note_device_ready(
                {index: self._device_t0.elapsed_time(event)
                 for index, event in self._device_marks})
            self._device_marks = []

    def held_bytes(self) -> int:
        """Bytes the guard holds between steps: its wire buffers."""
        return sum(b.numel() * b.element_size() for b in self._wires.values())

    def summary(self) -> dict:
        return self._summary(shadow_buckets=self.shadow_buckets)

    def _release(self) -> None:
        """At close: the comm hook, which DDP cannot unregister, becomes a plain allreduce
        (``closed``); no reference to the DDP model is kept, so a model dropped after an error
        is freed (docs/errors.md, "After a check fired")."""
        if self.averaging is not None:
            self.averaging.closed = True
        self.averaging = self.complete_unissued = None
        self._records = []


def _failed_bucket(records: list[BucketRecord]) -> tuple[int, RuntimeError] | None:
    """The first bucket whose allreduce failed, and the backend's error (None: none did)."""
    for record in records:
        if record.done is None or not record.done.done():
            continue
        try:
            record.done.value()
        except RuntimeError as exc:
            return record.index, exc
    return None
