"""A step's verdict from its reduced buckets, and the run's statistics (one ledger per DDP guard).

``Ledger.settle`` is the only place a step is judged. In order:
  1. wait for the step's buckets and blocks; the clean check (``control_counts_host.
     check_counts`` on the step's counted block, ``CountedStep``) passes the clean buckets on
     the device and brings the verdicts — and each bucket's wire-overflow flag, where the wire
     can overflow — to the host in ONE synchronization; a bucket it cannot pass is decoded
     (every rank first gathers every rank's slots: one extra collective, entered by every rank
     since every rank sees the same counts) and ``control.verify`` raises the named error (the
     same on every rank) or names the ranks whose own gradients held NaN/inf; a replica row
     that fails raises ``ReplicaDivergence`` after the buckets pass;
  2. a local non-finite gradient: under ``nonfinite="raise"`` ``NonFiniteGradient`` naming the
     ranks; otherwise an event names them and the step is skipped on every rank together;
  3. overflow: every bucket with a local non-finite gradient or a fired wire flag (the sum of
     its reduced wire, NaN or ±inf when any element is) has its non-finite elements counted
     exactly (a second host sync, on such steps only; a finite sum that merely overflowed
     counts 0). Any count > 0 skips the step on every rank — the same reduced values, so the
     same decision;
  4. the shared scale policy is updated with the shared overflow decision;
  5. a step that overflowed on the wire alone (no rank's own gradient was non-finite) leaves
     the wire's inf in DDP's gradients, as ``fp16_compress_hook`` does, and is marked
     *pending* with a ``WireOverflow`` event. A loss scaler (``torch.amp.GradScaler``) sees
     the inf, skips ``optimizer.step()`` and backs off exactly as under that hook; an
     ``optimizer.step()`` that does run while the step is pending — the README's plain loop,
     ``backward(); opt.step()``, with no scaler — first has every parameter's ``.grad`` set to
     None (``drop_pending``, from an optimizer step pre-hook ``harden()`` registers), so the
     optimizer skips the step exactly, on every rank, and no inf reaches the weights. Whether
     the optimizer step runs is the only sound sign of a scaler the hook can read. A caller of
     the step protocol (``begin_step``/``finish_step``) learns the verdict from
     ``finish_step`` and skips the step itself, so nothing is marked for it
     (``protocol_used``, from ``begin_step``).

What the guards tell the ledger besides a step goes through its methods (``count_check``,
``count_replica_slice``, ``protocol_used``, ``new_step``, ``note_device_ready``), so that its
statistics have one writer.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from openclaw_ref.sync.base import Wire
from openclaw_ref.sync.errors import (
    BucketMisalignment,
    ClockMismatch,
    ConsistencyError,
    Event,
    MissingGradient,
    NonFiniteGradient,
    ReplicaDivergence,
    ScaleMismatch,
)
from openclaw_ref.sync.evidence import checks
from openclaw_ref.sync.evidence.control import BucketVerdict, verify
from openclaw_ref.sync.evidence.control_counts import CountCheck, CountLayout, first_failing_field
from openclaw_ref.sync.evidence.control_counts_host import check_counts
from openclaw_ref.sync.evidence.control_layout import (
    NONFINITE,
    READY_UNIT_US,
    SLOT_FIELDS,
    decode_block,
)
from openclaw_ref.sync.evidence.precision import OverflowStats, ScalePolicy, count_nonfinite

WIRE_OVERFLOW = "WireOverflow"  # Event kind: a wire-only overflow (step 5)


@dataclass
class BucketRecord:
    """One bucket reduced this step, as this rank saw it."""

    index: int
    params: list[str]  # this rank's members, to name the bucket in errors
    elements: int  # gradient elements on the wire (excluding the control block)
    block: torch.Tensor | None  # the reduced control block (a row of the step's block)
    reduced: torch.Tensor  # the reduced gradient elements, still in the wire dtype
    done: torch.futures.Future | None = None  # waited on before anything is read
    # 0-dim sum of the reduced wire where the wire itself can overflow (an fp16 wire, a
    # pre-scale); None where it cannot (the average of finite values is finite)
    flag: torch.Tensor | None = None


@dataclass
class CountedStep:
    """A step whose buckets were checked by counts (``control_counts``): the reduced step
    block, its layout, and the failure path — ``gather`` (a collective every rank enters
    together: each rank's ``B × SLOT_FIELDS`` slots, then its replica row) and ``replicas``
    (the replica error the gathered rows show, given the active ranks, or None)."""

    block: torch.Tensor
    layout: CountLayout
    gather: Callable[[], list[list[int]]]
    replicas: Callable[[list[list[int]], list[int]], ConsistencyError | None]


def gather_step_rows(group, slots: list[list[int]], flags, replicas) -> list[list[int]]:
    """Every rank's slots of a counted step and its replica row, in rank order: the failure
    path's one extra collective (every rank sees the same failing counts, so all enter it).
    ``flags``: the non-finite flags the counts were written with (host booleans, or a device
    tensor), folded into the slots; ``replicas``: the ``ReplicaSlices`` whose row rides along."""
    if flags is not None:
        nonfinite = flags if isinstance(flags, list) else flags.ne(0).tolist()
        slots = [s[:NONFINITE] + [int(f)] + s[NONFINITE + 1:]
                 for s, f in zip(slots, nonfinite)]
    row = [v for s in slots for v in s] + replicas.gather_row()
    device = checks.collective_device(group, torch.device("cpu"))
    local = torch.tensor(row, dtype=torch.int64, device=device)
    return checks.gather_rows(local, group).tolist()


_UNNAMED = {"missing": BucketMisalignment, "clock": ClockMismatch, "bucket": BucketMisalignment,
            "digest": BucketMisalignment, "scale": ScaleMismatch, "absent": MissingGradient}


class Ledger:
    """Verifies a step's buckets (module docstring) and keeps the run's statistics. ``events``:
    the guard's list, which the ledger appends its findings to."""

    def __init__(self, world_size: int, policy: ScalePolicy, *, rank: int = 0,
                 global_ranks: Sequence[int] | None = None, raise_nonfinite: bool = True,
                 params: Sequence[torch.Tensor] = (), events: list[Event] | None = None) -> None:
        self.world_size = world_size
        self.params = list(params)  # whose gradients a wire-only overflow drops (step 5)
        self.drop_overflowed = True  # False once the caller uses the step protocol (step 5)
        self.pending = False  # a wire overflow's gradients await an optimizer step (step 5)
        self.rank = rank
        self.policy = policy
        self.global_ranks = list(global_ranks if global_ranks is not None else range(world_size))
        self.raise_nonfinite = raise_nonfinite
        # non-fatal findings (skipped non-finite steps)
        self.events: list[Event] = events if events is not None else []
        self.overflow = OverflowStats()
        self.checks_run = 0
        self.checks_passed = 0
        self.bucket_checks = 0
        self.replica_checks = 0
        self.max_skew_ms = 0.0
        self.max_skew_at: dict = {}
        self.last: dict = {}
        self._pending_checks = [0, 0]  # checks run/passed since the last settled step

    def count_check(self, passed: bool) -> None:
        """A check outside the buckets (replica, construction) ran at this step."""
        self._pending_checks[0] += 1
        self._pending_checks[1] += passed
        self.checks_run += 1
        self.checks_passed += passed

    def count_replica_slice(self) -> None:
        """A replica digest went into this step's exchange (compared by the step's verdict)."""
        self.replica_checks += 1

    def protocol_used(self) -> None:
        """The caller names its steps (``begin_step``) and reads each verdict from
        ``finish_step``: a wire overflow's gradients are no longer dropped for it (step 5)."""
        self.drop_overflowed = False

    def new_step(self) -> None:
        """A new step began: the last one's gradients are gone or used (step 5)."""
        self.pending = False

    def note_device_ready(self, ready_ms: dict) -> None:
        """The last step's ready times as the device measured them (CUDA events)."""
        self.last["device_ready_ms"] = ready_ms

    def _riders(self, records: Sequence[BucketRecord], extra: torch.Tensor | None = None
                ) -> tuple[list[int], torch.Tensor | None]:
        """Wait for the step's buckets; the indices of those with a wire flag, and the flags
        (then ``extra``) as one float64 tensor that rides along the check's host read."""
        for r in records:
            if r.done is not None:
                r.done.wait()
        flagged = [i for i, r in enumerate(records) if r.flag is not None]
        riders = [records[i].flag.to(torch.float64).reshape(1) for i in flagged]
        if extra is not None:
            riders.append(extra.to(torch.float64).reshape(-1))
        return flagged, torch.cat(riders) if riders else None

    @staticmethod
    def _flags(buckets: int, flagged: Sequence[int], host: Sequence[float]
               ) -> list[float | None]:
        """Each bucket's wire flag as read on the host (None where it has none)."""
        flags: list[float | None] = [None] * buckets
        for k, i in enumerate(flagged):
            flags[i] = host[k]
        return flags

    def _bucket_judged(self) -> None:
        """A bucket's check ran (counted before its verdict, which may raise)."""
        self.checks_run += 1
        self._pending_checks[0] += 1

    def _bucket_passed(self) -> None:
        """A bucket's check passed: its verdict was reached without an error."""
        self.checks_passed += 1
        self.bucket_checks += 1
        self._pending_checks[1] += 1

    def _verify(self, values: Sequence[float], record: BucketRecord) -> BucketVerdict:
        """``control.verify`` on one bucket's per-rank slots, its error naming global ranks."""
        try:
            return verify(decode_block(values, self.world_size), bucket=record.index,
                          params=record.params)
        except ConsistencyError as exc:
            raise exc.renumbered(self.global_ranks) from None

    def _verdicts(self, step: int, records: Sequence[BucketRecord], counted: CountedStep | None
                  ) -> tuple[list[BucketVerdict], list[float | None]]:
        """Every bucket's verdict (raising the first disagreement) and the host values of the
        wire flags (None where a bucket has none)."""
        assert counted is not None, "a step with buckets always sent its counts"
        flagged, riders = self._riders(records)
        checked, host = check_counts(counted.block, counted.layout, len(records), riders)
        verdicts = self._counted_verdicts(step, records, checked, counted)
        return verdicts, self._flags(len(records), flagged, host)

    def _counted_verdicts(self, step: int, records: Sequence[BucketRecord], checked: CountCheck,
                          counted: CountedStep) -> list[BucketVerdict]:
        """Verdicts of a counted step. A bucket or replica row the counts cannot pass: with no
        rank joined, every rank gathers the per-rank slots and ``verify`` judges and names as
        for the per-rank block; with a joined rank (which takes no part in a gather) the
        cause is told from the counts and the ranks are not named."""
        rows: list[list[int]] | None = None
        if not all(checked.ok) or not checked.replica_ok:
            if checked.joined:  # raises, unless only NaN counts failed (judged below)
                self._raise_unnamed(step, records, checked)
            else:
                rows = counted.gather()
        verdicts = []
        for b, (rec, ok, fig) in enumerate(zip(records, checked.ok, checked.figures)):
            self._bucket_judged()
            if ok:
                verdict = BucketVerdict(rec.index, fig.ready_ms, fig.skew_ms, fig.late_rank,
                                        fig.joined)
            elif rows is not None:
                values = [v for row in rows for v in row[b * SLOT_FIELDS:(b + 1) * SLOT_FIELDS]]
                verdict = self._verify(values, rec)
            else:  # joined, only NaN counts: the step is judged, the ranks unnamed
                verdict = BucketVerdict(rec.index, None, 0.0, None, True, nonfinite_seen=True)
            verdicts.append(verdict)
            self._bucket_passed()
        if not checked.replica_ok and rows is not None:
            tail = len(records) * SLOT_FIELDS
            active = [r for r, row in enumerate(rows) if row[0] == 0xA5]
            err = counted.replicas([row[tail:] for row in rows], active)
            if err is not None:
                raise err.renumbered(self.global_ranks) from None
        return verdicts

    def _raise_unnamed(self, step: int, records: Sequence[BucketRecord],
                       checked: CountCheck) -> None:
        """A disagreement while some rank had joined: its kind from the counts, no ranks."""
        why = ("the ranks cannot be named while a rank has joined (DDP.join()): a joined rank "
               "takes no part in the gather that names them")
        for rec, ok, counts in zip(records, checked.ok, checked.counts):
            field = None if ok else first_failing_field(counts, self.world_size)
            if field in _UNNAMED:
                raise _UNNAMED[field](f"the active ranks disagree on the {field} field; {why}",
                                      step=step, bucket=rec.index, params=rec.params)
        if not checked.replica_ok and checked.step_counts:
            raise ReplicaDivergence(f"parameter replicas differ bitwise; {why}", step=step)

    def _nonfinite(self, step: int, records: Sequence[BucketRecord],
                   verdicts: Sequence[BucketVerdict]) -> None:
        """Ranks whose own gradients held NaN/inf: raise, or record the event (the policy)."""
        for rec, v in zip(records, verdicts):
            if not v.nonfinite_ranks and not v.nonfinite_seen:
                continue
            err = NonFiniteGradient(
                "local gradients held NaN/inf before the wire" if self.raise_nonfinite else
                "local gradients held NaN/inf: the step is skipped on every rank",
                step=step, ranks=[self.global_ranks[r] for r in v.nonfinite_ranks],
                bucket=v.index, params=rec.params)
            if self.raise_nonfinite:
                raise err
            self.events.append(err.event())

    def settle(self, step: int, records: Sequence[BucketRecord], *, sync_ms: float,
               verify_started: float, counted: CountedStep | None = None) -> bool:
        """Judge the step (module docstring); True when the optimizer step may run.
        ``counted``: the step's counted block (``control_counts``), None only for a step that
        reduced no bucket."""
        exponent = self.policy.exponent
        verdicts, flags = (self._verdicts(step, records, counted) if records else ([], []))
        self._nonfinite(step, records, verdicts)
        suspect = [i for i, (v, f) in enumerate(zip(verdicts, flags))
                   if v.nonfinite_ranks or v.nonfinite_seen or (f is not None and not _finite(f))]
        counts = {i: count_nonfinite(records[i].reduced) for i in suspect}
        buckets = []
        for v, rec in zip(verdicts, records):
            late = None if v.late_rank is None else self.global_ranks[v.late_rank]
            entry = {"index": v.index, "elements": rec.elements, "skew_ms": v.skew_ms,
                     "late_rank": late}
            if v.ready_ms is not None:
                entry["ready_ms"] = v.ready_ms
            buckets.append(entry)
            if v.skew_ms > self.max_skew_ms:
                self.max_skew_ms = v.skew_ms
                self.max_skew_at = {"step": step, "bucket": v.index, "late_rank": late}
        overflow_elements = sum(counts.values())
        elements = sum(r.elements for r in records)
        overflowed = overflow_elements > 0
        self.overflow.add(elements, overflow_elements, skipped=overflowed)
        self.policy.update(overflowed)
        if overflowed and self.drop_overflowed and not any(
                v.nonfinite_ranks or v.nonfinite_seen for v in verdicts):
            self._mark_pending(step, overflow_elements, exponent)
        run, passed = self._pending_checks
        self._pending_checks = [0, 0]
        now = time.perf_counter()
        self.last = {
            "sync_ms": sync_ms + (now - verify_started) * 1e3,
            "verify_ms": (now - verify_started) * 1e3,
            "buckets": buckets,
            "overflow_elements": overflow_elements,
            "elements": elements,
            "overflowed": overflowed,
            "checks_run": run,
            "checks_passed": passed,
        }
        if self.policy.wire is Wire.FP16:  # a native or bf16 wire is never pre-scaled
            self.last.update(scale=2.0 ** exponent, scale_exp=exponent)
        return not overflowed

    def _mark_pending(self, step: int, overflow_elements: int, exponent: int) -> None:
        """Step 5 of the module docstring: the wire's inf stays until an optimizer step (no
        parameters to drop: a caller that always reads the verdict, such as the benchmark's
        bucketed engine, ``arms/bucketed.py``)."""
        if not self.params:
            return
        self.pending = True
        self.events.append(Event(
            WIRE_OVERFLOW, step, detail=f"{overflow_elements} reduced element(s) overflowed the "
            f"{self.policy.wire} wire (2^{exponent} pre-scale): a loss scaler skips this step; "
            "an optimizer step without one runs with every gradient dropped (.grad = None) on "
            "every rank, so no inf reaches the weights"))

    def drop_pending(self) -> None:
        """An optimizer step is about to run: a pending wire overflow's gradients go (step 5)."""
        if not self.pending:
            return
        self.pending = False
        for p in self.params:
            p.grad = None

    def summary(self) -> dict:
        return {
            **self.overflow.to_json(),
            "checks_run": self.checks_run, "checks_passed": self.checks_passed,
            "bucket_checks": self.bucket_checks, "replica_checks": self.replica_checks,
            "max_skew_ms": self.max_skew_ms, "max_skew_at": self.max_skew_at,
            "final_scale_exp": self.policy.exponent,
            "scale_backoffs": self.policy.backoffs, "scale_growths": self.policy.growths,
            "ready_time_resolution_ms": READY_UNIT_US / 1e3,
        }


def _finite(x: float) -> bool:
    return x - x == 0.0  # False for NaN and ±inf
