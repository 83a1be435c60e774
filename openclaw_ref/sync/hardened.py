"""``hardened``: stock DDP plus one comm hook that makes every bucket's sync verifiable.

``harden(ddp_model, cfg, ctx)`` works on any ``DistributedDataParallel`` model (under our
launcher, under ``torchrun``, inside Lightning's DDP strategy): it checks at construction that
parameter names, shapes, dtypes and order agree on all ranks, starts a watchdog, and registers
``hardened_hook``. Per bucket, the hook

  1. writes ``g · 2^e / W`` into a wire buffer of the chosen dtype (divide before the cast);
  2. appends the control block (``control.py``): this rank's clock, bucket index, membership
     digest, scale exponent, local non-finite flag and bucket-ready time in its own slot;
  3. issues ONE allreduce over gradients + block — exactly the collectives stock DDP issues;
  4. hands DDP the unscaled fp32 average (a zero-copy view for the fp32 wire).

``HardenState.finish_step`` then reads every reduced block of the step with one host sync and
raises ``ClockMismatch`` / ``BucketMisalignment`` / ``ScaleMismatch`` / ``NonFiniteGradient``
identically on every rank, or decides overflow (skip the optimizer step everywhere).

Usage outside the training loop::

    ddp = DistributedDataParallel(model, find_unused_parameters=True)
    state = harden(ddp, SyncConfig(wire="fp16", scale="auto"))
    for step, batch in enumerate(loader):
        state.begin_step(step)
        loss_fn(ddp(batch)).backward()
        if state.finish_step(step):
            opt.step()
        opt.zero_grad()
"""

from __future__ import annotations

import os
import time
import warnings

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from openclaw_ref import checks
from openclaw_ref.errors import ConsistencyError, Event
from openclaw_ref.launch import RankContext
from openclaw_ref.sync.base import SyncConfig, SyncStrategy
from openclaw_ref.sync.control import (
    BucketRecord, Ledger, block_size, encode_slot, membership_digest, write_block,
)
from openclaw_ref.sync.ddp import wrap_ddp
from openclaw_ref.sync.precision import ScalePolicy, from_wire, to_wire
from openclaw_ref.sync.watchdog import Watchdog, exit_fatal, namespace_for


class HardenState:
    """Everything the hook and the per-step check share (one per DDP model)."""

    def __init__(self, cfg: SyncConfig, rank: int, world_size: int, names: dict[int, str],
                 group=None) -> None:
        # user configuration
        self.cfg = cfg
        self.rank = rank
        self.world_size = world_size
        self.group = group
        self.policy = ScalePolicy.from_config(cfg)
        # internal state
        self.names = names  # id(parameter) -> name
        self.named_parameters: list[tuple[str, nn.Parameter]] = []
        self.watchdog: Watchdog | None = None
        self.clock = 0
        self.step_t0 = time.perf_counter()
        self._first_issue: float | None = None
        self._explicit_clock = False
        self._members: dict[tuple[int, ...], tuple[int, list[str]]] = {}
        self._wires: dict[int, torch.Tensor] = {}
        self._records: list[BucketRecord] = []
        self.required: set[int] = set()  # ids of parameters that must get a gradient every step
        self.present: set[int] = set()  # required parameters that got a local gradient this step
        # statistics
        self.ledger = Ledger(world_size, self.policy)
        self.events: list[Event] = []
        self.nccl_async_error_handling = os.environ.get("TORCH_NCCL_ASYNC_ERROR_HANDLING")

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

    def wire_buffer(self, index: int, n: int, device: torch.device) -> torch.Tensor:
        """A reused buffer per bucket: DDP copies the hook's result out into the gradients
        before the next step, so the previous step's reduced values are never needed again."""
        size = n + block_size(self.world_size)
        buf = self._wires.get(index)
        if buf is None or buf.numel() != size or buf.device != device:
            buf = self._wires[index] = torch.empty(size, dtype=self.policy.dtype, device=device)
        return buf

    # the step protocol --------------------------------------------------------------------
    def begin_step(self, step: int) -> None:
        """Set the logical clock and the ready-time origin; every K steps compare replicas."""
        self.clock = step
        self._explicit_clock = True
        self._records = []
        self.present.clear()
        self._first_issue = None
        k = self.cfg.replica_check_every
        if k and step % k == 0 and self.named_parameters:
            self.ledger.replica_checks += 1
            try:
                checks.replica_check(self.named_parameters, step=step, group=self.group)
            except ConsistencyError:
                self.ledger.count_check(False)
                raise
            self.ledger.count_check(True)
        self.step_t0 = time.perf_counter()

    def finish_step(self, step: int | None = None) -> bool:
        """Verify every bucket of the step; False = every rank skips this optimizer step."""
        t = time.perf_counter()
        records, self._records = self._records, []
        exposed = (t - self._first_issue) * 1e3 if self._first_issue is not None else 0.0
        applied = self.ledger.settle(self.clock if step is None else step, records,
                                     sync_ms=exposed, verify_started=t)
        if not self._explicit_clock:
            self.clock += 1
        self._explicit_clock = False
        return applied

    def step_metrics(self) -> dict:
        return dict(self.ledger.last)

    def summary(self) -> dict:
        return {**self.ledger.summary(), "wire": self.cfg.wire,
                "scale_mode": "auto" if self.policy.auto else "fixed"}

    def close(self) -> None:
        if self.watchdog is not None:
            self.watchdog.close()


def hardened_hook(state: HardenState, bucket):  # no annotations: DDP rejects string ones
    """The DDP comm hook (see the module docstring); one allreduce per bucket, like DDP's own.
    ``bucket`` is a ``dist.GradBucket``; returns a ``Future[Tensor]`` of the bucket's size."""
    t = time.perf_counter()
    if state._first_issue is None:
        state._first_issue = t
    grads = bucket.buffer()
    n, index = grads.numel(), bucket.index()
    digest, names = state.membership(bucket)
    exponent = state.policy.exponent_for(state.rank)
    wire = state.wire_buffer(index, n, grads.device)
    local_nonfinite = to_wire(grads, wire[:n], state.world_size, exponent)
    block = wire[n:]
    write_block(block, state.rank,
                encode_slot(clock=state.clock, bucket=index, digest=digest, scale_exp=exponent,
                            ready_s=t - state.step_t0, absent=state.first_absent(bucket)),
                local_nonfinite)
    state._records.append(BucketRecord(index, names, n, block, wire[:n]))
    clock, watchdog = state.clock, state.watchdog
    if watchdog is not None:
        watchdog.issued(clock, index)
    fut = dist.all_reduce(wire, group=state.group, async_op=True).get_future()

    def unpack(_: torch.futures.Future) -> torch.Tensor:
        if watchdog is not None:
            watchdog.completed(clock, index)
        return from_wire(wire[:n], exponent, grads.dtype)

    return fut.then(unpack)


def _bucket_sizes(ddp_model: DDP) -> list[int] | None:
    """DDP's bucket sizes in bytes (fixed at construction with find_unused_parameters=True;
    otherwise rebuilt once after the first iteration and broadcast from rank 0 by DDP)."""
    try:
        raw = ddp_model._get_ddp_logging_data().get("bucket_sizes", "")
    except Exception:  # a private API: a missing layout only weakens the check
        return None
    return [int(x) for x in str(raw).split(",") if x.strip()]


def harden(ddp_model: DDP, cfg: SyncConfig | None = None, ctx: RankContext | None = None, *,
           check_construction: bool = True, group=None) -> HardenState:
    """Make a DDP model's gradient sync verifiable; returns the state to drive per step.

    ``ctx`` (our launcher's) gives the store for the watchdog and the way to report a hang from
    its thread; without it (plain ``torchrun``) the default store and ``os._exit`` are used.
    ``check_construction=False`` skips the cross-rank parameter check (tests use it to show that
    the in-band membership digest alone still catches a swapped registration).
    """
    cfg = cfg or SyncConfig(name="hardened")
    rank = dist.get_rank(group)
    world = dist.get_world_size(group)
    named = list(ddp_model.module.named_parameters())
    if check_construction:
        checks.construction_check(named, group=group, layout=_bucket_sizes(ddp_model))
    state = HardenState(cfg, rank, world, {id(p): n for n, p in named}, group)
    state.named_parameters = named
    required = checks.required_gradient_names(ddp_model.module)
    for name, p in named:
        if required is not None and name in required and p.requires_grad:
            state.required.add(id(p))
            p.register_hook(lambda grad, key=id(p): state.present.add(key))
    if check_construction:
        state.ledger.count_check(True)
    store = ctx.store if ctx is not None else dist.distributed_c10d._get_default_store()
    report = ctx.report_fatal if ctx is not None else exit_fatal
    state.watchdog = Watchdog(store, rank, world, cfg.watchdog_s, namespace_for(store, rank),
                              on_timeout=report)
    if dist.get_backend(group) == "nccl" and state.nccl_async_error_handling is None:
        warnings.warn("TORCH_NCCL_ASYNC_ERROR_HANDLING was not set before the NCCL process group "
                      "was created; a failed collective may hang instead of aborting")
    ddp_model.register_comm_hook(state, hardened_hook)
    return state


class Hardened(SyncStrategy):
    """``hardened``: DDP (same buckets, same collectives) + ``harden``."""

    name = "hardened"

    def wrap(self, model: nn.Module, ctx: RankContext) -> nn.Module:
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

    def summary(self) -> dict:
        return self.state.summary()

    def close(self) -> None:
        if hasattr(self, "state"):
            self.state.close()
