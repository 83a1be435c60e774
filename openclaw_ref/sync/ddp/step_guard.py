"""``harden()``'s default guard (``Guard.STEP``): DDP reduces the gradients on its own C++ path,
and everything the guard checks rides in ONE small allreduce per step.

Why not a comm hook: a Python comm hook costs a crossing into Python per bucket (PyTorch's own
``allreduce_hook`` already costs 1.04–1.09× stock DDP for that alone), and most of what the
per-bucket hook (``Guard.BUCKET``) checks does not need it on stock DDP: DDP makes the bucket
layout identical on every rank (rank 0's rebuilt order is broadcast) and the start-up check
proves the parameters agree; a clock disagreement, a missing gradient, a gradient that was never
averaged, a rank's NaN, the replica digest and the ready-time skew are facts of the whole step.

Per step, on every rank, with the default ``native``/``fp32`` wire (no comm hook at all) or an
``fp16`` wire (DDP's built-in C++ ``FP16_COMPRESS`` hook: PyTorch's ``fp16_compress_hook``):
  1. the forward opens the step (ready-time origin; a step whose verdict was deferred is
     judged first), and a forward pre-hook on the module DDP runs records whether this
     forward is DDP's own, which prepares its reducer (``averaged.ddp_forward``: ``ddp(x)``,
     ``ddp.forward(x)``, a compiled DDP, DDP inside another wrapper alike);
  2. a hook on each gradient accumulator DDP itself hooked records that the parameter got a
     gradient — the node DDP watches, so a conversion that replaced it shows as absent;
  3. at the end of the backward's graph task (a callback queued when the backward reaches the
     forward's output, so it runs before DDP's own finalize, which waits for the last bucket),
     ``_exchange`` gathers the step's facts — clock, whether DDP reduced every bucket, the first
     absent required parameter, this rank's non-finite flag (one pass over its own gradients,
     still local until DDP's finalize copies the averages back; with
     ``gradient_as_bucket_view`` each gradient is summed as it is accumulated, before DDP can
     reduce its bucket), its ready time, one replica slice's digest — writes them as counts
     (``control_counts``: B = 1) and issues their allreduce, which overlaps DDP's last bucket;
  4. after DDP's finalize (a second callback) — or, deferred (``SyncConfig.verdict_at``; the
     default on CUDA), at the optimizer step's pre-hook — ``ledger.Ledger.settle`` checks the
     reduced counts: clean, one host read; otherwise every rank gathers the per-rank slots with
     one more collective, on that step only, and raises the same named error.
A rank whose DDP did not reduce every bucket (a parameter without a gradient under
``find_unused_parameters=False``, a forward through ``ddp.module``, parameters replaced after
wrapping) sends zeros for the buckets its DDP never issued, then its slot marked so, with
why and the first parameter concerned, so that the other ranks' allreduces complete and every
rank raises the same error at the same step, worded from that evidence (``control.not_reduced``).
A forward DDP would not have averaged (``no_sync()``, ``require_backward_grad_sync = False``)
arms nothing, through the wrapper or around it. A rank that joined
(``DDP.join()``) sends a "joined" slot after DDP's shadow allreduces.

With the compute canary on (``SyncConfig.canary_every``, ``canary.schedule``) step 3 also XORs
a probe's gradient digest into the replica digest, and every K steps the settle broadcasts the
probe's input: two collectives per K steps, none per step.

What this mode does not see (``Guard.BUCKET`` does): which bucket held a rank's NaN, the
per-bucket ready-time skew, a bucket whose membership differs while its size matches (DDP's
broadcast layout prevents it; the start-up check compares the layout), a pre-scaled fp16 wire
and a bf16 wire (refused here with ``BadInput``).
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils._pytree import tree_leaves

from openclaw_ref.sync.attached import MISSING, Unset, eager
from openclaw_ref.sync.base import SyncConfig, Wire
from openclaw_ref.sync.canary.row import step_digests
from openclaw_ref.sync.canary.schedule import canary_for
from openclaw_ref.sync.ddp.ddp_guard import DDPGuard
from openclaw_ref.sync.ddp.step_setup import (
    JoinedExchange,
    cuda_mark,
    exchange_block,
    exchange_layout,
    queue_callback,
    send_unissued,
    why_unissued,
)
from openclaw_ref.sync.errors import ConsistencyError
from openclaw_ref.sync.evidence.averaged import _accumulates, _accumulator, ddp_forward
from openclaw_ref.sync.evidence.control_counts_write import write_counts
from openclaw_ref.sync.evidence.control_layout import (
    encode_slot,
    joined_slot,
    membership_digest,
    unissued_slot,
)
from openclaw_ref.sync.evidence.heartbeat import STEP_EXCHANGE
from openclaw_ref.sync.evidence.ledger import BucketRecord, CountedStep, gather_step_rows
from openclaw_ref.sync.evidence.precision import finite_sum, nonfinite_flags


class StepGuard(DDPGuard):
    """One per hardened DDP model in step mode: the step lifecycle (module docstring), the
    facts it gathers, and the statistics it reports (the surface: ``GuardBase``, the step
    protocol: ``DDPGuard``)."""

    def __init__(self, ddp: DDP, cfg: SyncConfig, named: list[tuple[str, nn.Parameter]],
                 synchronized: list[tuple[str, nn.Parameter]],
                 module: nn.Module | None = None) -> None:
        super().__init__(cfg, ddp.process_group, named, synchronized)
        self.ddp = ddp
        # the module DDP runs (its pre-hook asks whether the forward is DDP's own), and the
        # one whose pre-hook opens the step first: DDP's module and DDP itself; both the user's
        # module under replicate()
        self.module = module if module is not None else ddp.module
        self.entry = module if module is not None else ddp
        ignored = set(getattr(ddp, "parameters_to_ignore", ()))
        self.tracked = [(n, p) for n, p in named if p.requires_grad and n not in ignored]
        self.names = [n for n, _ in self.tracked]
        self._index = {id(p): i for i, (_, p) in enumerate(self.tracked)}
        self.accumulators = [_accumulator(p) for _, p in self.tracked]  # the nodes DDP hooked
        device = self.tracked[0][1].device if self.tracked else torch.device("cpu")
        self.layout = exchange_layout(self.world_size)
        self.block = exchange_block(self.world_size, device)
        self.digest = membership_digest([(n, tuple(p.shape), str(p.dtype), 0, p.numel())
                                         for n, p in self.tracked])
        self.required: list[int] = []  # indices into ``tracked`` (``checks.required_…``)
        self._device_t0 = self._device_ready = None  # CUDA events of the ready time
        self.present = bytearray(len(self.tracked))
        # this backward's sums of each rank's own gradients, taken as each is accumulated
        self.local_sums: list[torch.Tensor] = []
        self.prepared = False  # DDP's own forward prepared its reducer (``ddp_forward``)
        self._task = -2  # graph task whose end runs the exchange (one per backward)
        self._pending: tuple[BucketRecord, CountedStep] | None = None
        self._sent: list[int] = []  # this step's slot and flags, for a failure gather
        self._flags: list[bool] | torch.Tensor | None = None
        self.shadow_steps = 0
        self.canary = canary_for(self, cfg.canary_every or 0)  # the compute canary
        self.digests = step_digests(self.replicas, self.canary)

    # -- registration (harden) ----------------------------------------------------------------
    def install(self, required: set[str] | None) -> None:
        """Register the hooks of the module docstring; ``required``: names that must get a
        gradient every step (None: presence judged only for DDP's own completion)."""
        self.required = [i for i, n in enumerate(self.names) if required and n in required]
        as_view = bool(getattr(self.ddp, "gradient_as_bucket_view", False))
        for i, (node, (_, p)) in enumerate(zip(self.accumulators, self.tracked)):
            self.handles.append(node.register_hook(self._arrived(i, p, not as_view)))
            if as_view:  # the gradient is DDP's bucket, which it may reduce once its hook ran
                self.handles.append(p.register_post_accumulate_grad_hook(self._summed))
        if self.entry is not self.module:  # DDP's __call__: the step opens before DDP's forward
            self.handles.append(self.entry.register_forward_pre_hook(eager(self._wrapper_forward)))
        self.handles.append(self.module.register_forward_pre_hook(eager(self._module_pre_forward)))
        self.handles.append(self.module.register_forward_hook(eager(self._module_forward)))
        if self.canary is not None:
            self.handles.append(self.canary.install())
        original = self.ddp.join_hook
        self.handles.append(Unset(self.ddp, "join_hook", self.ddp.__dict__.get("join_hook",
                                                                             MISSING)))
        self.ddp.join_hook = lambda **kwargs: JoinedExchange(original(**kwargs), self)

    def _arrived(self, i: int, p: nn.Parameter, sums: bool):
        """The post-hook on the accumulator DDP hooked (it runs after DDP's own): the parameter
        got a gradient through it; with ``sums``, this rank's gradient is summed now, while it
        is still in cache (about a third of the cost of a pass over cold gradients at the end
        of the backward, measured on the MLP here) and still local — DDP copied it into its
        bucket, and writes the average back only at its finalize."""
        present, local_sums = self.present, self.local_sums

        def arrived(grad_inputs, grad_outputs) -> None:
            present[i] = 1
            if sums and p.grad is not None:
                local_sums.append(finite_sum(p.grad))
        return arrived

    def _summed(self, p: torch.Tensor) -> None:
        if p.grad is not None:
            self.local_sums.append(finite_sum(p.grad))

    # -- the step -------------------------------------------------------------------------------
    def _wrapper_forward(self, module, args) -> None:
        self.open_forward()

    def _module_pre_forward(self, module, args) -> None:
        """Forward pre-hook of the module DDP runs: the step opened (where the DDP object's
        pre-hook did not), and whether DDP's own forward prepared its reducer for the next
        backward (``averaged.ddp_forward``: however DDP's forward was reached)."""
        self.open_module_forward()
        if (torch.is_grad_enabled() and self.ddp.require_backward_grad_sync
                and ddp_forward(self.ddp)):
            self.prepared = True

    def _start_clock(self) -> None:
        """The ready-time origin: the host clock, and on CUDA an event on the current stream
        (the host clock there measures kernel launches; the event is read after the step's
        host sync, as ``device_ready_ms``)."""
        self.step_t0 = time.perf_counter()
        self._device_t0 = cuda_mark() if self.on_cuda else None

    def _module_forward(self, module, args, output) -> None:
        """Forward hook of ``ddp.module``: arm the exchange for the backward of an output that
        DDP should average — outside ``no_sync()`` / with ``require_backward_grad_sync`` set,
        as DDP decides at its forward, whether this one ran through the wrapper or around it
        (a bypass on a micro-step DDP would not have averaged changes nothing DDP does)."""
        if self.closed or not torch.is_grad_enabled():
            return
        self._forget_arrivals()  # a no_sync backward's, not this step's
        if not self.ddp.require_backward_grad_sync:
            return  # DDP's own decision for this forward, through the wrapper or around it
        out = next((t for t in tree_leaves(output)
                    if isinstance(t, torch.Tensor) and t.grad_fn is not None), None)
        if out is not None:
            out.grad_fn.register_prehook(lambda grads: self._arm())

    def _forget_arrivals(self) -> None:
        self.present[:] = bytes(len(self.present))
        self.local_sums.clear()

    def _arm(self) -> None:
        task = torch._C._current_graph_task_id()
        if task == self._task or self.closed:
            return
        self._task = task
        queue_callback(self._exchange)

    def _exchange(self) -> None:
        """The end of the backward (callback 1): the step's facts, sent (module docstring).
        Whether DDP reduced: it did iff DDP's own forward prepared its reducer
        (``prepared``) and every parameter it waits for got a gradient through the very
        accumulator it hooked — or it tolerates unused ones, which it marks ready at its first
        hook of the backward: none ran, none is marked."""
        self._task = -2
        hooked = any(self.present)  # DDP's own hooks ran (else it marked nothing ready)
        if self.closed or not (hooked or self._received_elsewhere()):
            self._forget_arrivals()  # reached no parameter DDP averages (``autograd.grad``)
            return
        t = time.perf_counter()
        prepared, self.prepared = self.prepared, False
        complete = prepared and hooked and (self._unused_allowed() or all(self.present))
        first_unissued, why = 0, None
        absent = next((i for i in self.required if not self.present[i]), None)
        if not complete:
            present = {id(p): bool(seen) for (_, p), seen in zip(self.tracked, self.present)}
            first_unissued = send_unissued(self.ddp, prepared, present, self.cfg.wire, self.group)
            why, absent = why_unissued(self.module, self.tracked, self.accumulators,
                                       self.present, prepared)
        flags = nonfinite_flags(self.local_sums)
        self._forget_arrivals()
        slot = encode_slot(clock=self.clock, bucket=first_unissued, digest=self.digest,
                           scale_exp=0, ready_s=t - self.step_t0, absent=absent)
        if why is not None:
            slot = unissued_slot(slot, why)
        replica = None
        if self.replicas.enabled:
            replica = self.replicas.digest_slice(self.clock)
            self.ledger.count_replica_slice()
        if self.canary is not None:
            replica = self.canary.fold(replica)
        write_counts(self.block, self.layout, self.rank, [slot], flags, replica)
        self._sent, self._flags = slot, flags
        self._device_ready = cuda_mark() if self._device_t0 is not None else None
        work = dist.all_reduce(self.block, group=self.group, async_op=True)
        if self.watchdog is not None:
            self.watchdog.issued(self.clock, STEP_EXCHANGE, work)
        grads = [p.grad for _, p in self.tracked if p.grad is not None]
        record = BucketRecord(None, self.names, sum(g.numel() for g in grads), None, grads,
                              done=work.get_future())
        counted = CountedStep(self.block, self.layout, self._gather, self._replica_error)
        self._pending = (record, counted)
        if not self.deferred:
            # Waited on here, before DDP's finalize: a peer that died makes this wait fail,
            # and it is raised as the failed collective it is (DDP's own wait would raise a
            # bare RuntimeError). The buckets still in flight complete meanwhile.
            self._wait(work)
            queue_callback(self._settle)  # after DDP's finalize, queued during the backward

    def _received_elsewhere(self) -> bool:
        """No accumulator DDP hooked ran: did some parameter of the module get a gradient in
        this backward anyway (a conversion or a replacement after wrapping)? Asked of the
        engine, on such backwards only."""
        return any(_accumulates(p) for p in self.module.parameters() if p.requires_grad)

    def _wait(self, work) -> None:
        try:
            work.wait()
        except RuntimeError as exc:
            self._pending = None
            self._collective_failed(exc, self.clock)

    def _unused_allowed(self) -> bool:
        """DDP completes a backward that leaves parameters without a gradient (it marks them
        ready itself) under ``find_unused_parameters`` and a static graph."""
        return bool(self.ddp.find_unused_parameters or getattr(self.ddp, "static_graph", False))

    def _settle(self) -> None:
        """Judge the pending step (callback 2, or where a deferred verdict is read)."""
        if self._pending is None:
            return
        record, counted = self._pending
        self._pending = None
        t = time.perf_counter()
        if self.cfg.wire is Wire.FP16 and record.reduced:  # the fp16 wire itself may overflow
            record.flag = torch.stack([finite_sum(g) for g in record.reduced]).sum()
        step = self.clock
        self.clock += 1
        try:
            self._verdict = self.ledger.settle(step, [record], sync_ms=(t - self.step_t0) * 1e3,
                                               verify_started=t, counted=counted)
            if self.canary is not None:
                self.canary.settled(step)
            if self._device_t0 is not None and self._device_ready is not None:  # synced
                self.ledger.note_device_ready(
                    {"step": self._device_t0.elapsed_time(self._device_ready)})
        except ConsistencyError:
            self.failed = True
            raise
        except RuntimeError as exc:
            self._collective_failed(exc, step)
        finally:
            if self.watchdog is not None:
                self.watchdog.settled(step)

    def progress(self) -> tuple[int, int]:
        """(clock, 1 while a step's verdict is pending, else 0)."""
        return self.clock, int(self._pending is not None)

    @property
    def last_layout(self) -> list[tuple[int, list[str]]]:
        """DDP's buckets now, (index, member names): the layout its C++ reduction uses (read
        from the reducer when asked; the guard itself never needs it)."""
        names = {id(p): n for n, p in self.tracked}
        return [(b.index(), [names.get(id(p), "?") for p in b.parameters()])
                for b in self.ddp.reducer._get_zeros_like_grad_buckets()]

    def _gather(self) -> list[list[int]]:
        return gather_step_rows(self.group, [self._sent], self._flags, self.digests)

    def _replica_error(self, rows: list[list[int]], active: list[int]):
        return self.digests.divergence(rows, active, step=self.clock - 1)

    def joined_exchange(self) -> None:
        """A joined rank's part of an active step (``DDP.join()``): after DDP's shadow
        allreduces, a slot that abstains from every comparison."""
        write_counts(self.block, self.layout, self.rank, [joined_slot()], None, None)
        self.shadow_steps += 1
        dist.all_reduce(self.block, group=self.group)

    def held_bytes(self) -> int:
        """Bytes the guard holds between steps: the step's count block."""
        return self.block.numel() * self.block.element_size()

    def summary(self) -> dict:
        return self._summary(guard=self.cfg.guard.value, shadow_steps=self.shadow_steps)

    def joining(self) -> bool:
        """Inside ``Join([ddp])``: a joined rank would never reach a collective of every rank
        outside DDP's own (the canary's broadcast)."""
        config = getattr(self.ddp, "_join_config", None)
        return bool(config is not None and config.enable)

    def _release(self) -> None:
        """At close: a pending step is dropped. The wire (DDP's own reduction) is untouched."""
        self._pending = None

