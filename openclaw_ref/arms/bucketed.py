"""``bucketed``: a bucketed allreduce engine without DDP, for the seed's L2-norm bucketing (F2).

F2 cannot live in a DDP comm hook: DDP fixes bucket membership at construction. This engine
owns the whole sync instead. Per step, after backward (no compute/communication overlap — its
sync time is fully exposed, which the benchmark reports honestly):

  1. the planner (``bucket_plan.py``) orders the parameters; the stream is cut into frames of
     at most ``bucket_cap_mb`` (frame sizes never depend on the plan, see ``bucket_plan``);
  2. each frame is packed (missing local gradients zero-filled, ``g · 2^e / W`` in the wire
     dtype), gets its per-rank control block (``blocks``) — and the *last* frame also carries one
     presence count per parameter — and is issued as ONE async allreduce, in plan order;
  3. after the waits, the step is verified with one host sync (raising on any disagreement,
     identically on every rank), overflow decided, and the averages written to ``p.grad``.

Presence counts reproduce DDP's ``find_unused_parameters`` semantics without its separate
used-map allreduce: a parameter no rank produced a gradient for keeps ``grad = None`` (so the
optimizer leaves it alone, as under DDP); any other gets sum/W with zeros for absent ranks.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch import nn

from openclaw_ref.arms.blocks import BlockLedger, block_size, write_block
from openclaw_ref.arms.bucket_plan import (
    BucketPlan,
    BucketPlanner,
    Frame,
    ParamInfo,
    cut_frames,
    make_planner,
)
from openclaw_ref.arms.config import ArmConfig, Planner
from openclaw_ref.arms.strategy import SyncStrategy
from openclaw_ref.sync.base import RankInfo
from openclaw_ref.sync.errors import ConsistencyError
from openclaw_ref.sync.evidence import checks
from openclaw_ref.sync.evidence.control_layout import encode_slot
from openclaw_ref.sync.evidence.heartbeat import namespace_for
from openclaw_ref.sync.evidence.job_end import exit_fatal
from openclaw_ref.sync.evidence.ledger import BucketRecord
from openclaw_ref.sync.evidence.precision import ScalePolicy, finite_sum, from_wire, to_wire
from openclaw_ref.sync.evidence.replica_digest import ReplicaDigest
from openclaw_ref.sync.evidence.watchdog import Watchdog


def has_nonfinite(t: torch.Tensor) -> torch.Tensor:
    """0-dim bool: does ``t`` hold a NaN or ±inf? Exact (no overflow of a sum): one fused
    min/max pass with no temporaries (NaN propagates through both, +inf reaches the max, −inf
    the min). Used for the local attribution, on non-finite steps only."""
    if t.numel() == 0:
        return torch.zeros((), dtype=torch.bool, device=t.device)
    lo, hi = torch.aminmax(t)
    return ~(torch.isfinite(lo) & torch.isfinite(hi))


def cap_elements(cfg: ArmConfig, dtype: torch.dtype = torch.float32) -> int:
    """Frame capacity in gradient elements: the cap counts gradient bytes, as DDP's does."""
    return max(1, int(cfg.bucket_cap_mb * 2**20) // torch.empty((), dtype=dtype).element_size())


class BucketedEngine:
    """The engine on one rank (see the module docstring)."""

    def __init__(self, model: nn.Module, cfg: ArmConfig, rank: int, world_size: int, *,
                 store: dist.Store | None = None, report=exit_fatal, group=None) -> None:
        self.cfg = cfg
        self.rank = rank
        self.world_size = world_size
        self.group = group
        self.named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        self.params = [p for _, p in self.named]
        required = checks.required_gradient_names(model)
        self.required = {i for i, (n, _) in enumerate(self.named)
                         if required is not None and n in required}
        self.info = [ParamInfo(n, tuple(p.shape), str(p.dtype), p.numel()) for n, p in self.named]
        self.planner: BucketPlanner = make_planner(cfg.planner, self.info)
        self.policy = ScalePolicy.from_config(cfg.harden)
        self.ledger = BlockLedger(world_size, self.policy, rank=rank)
        self.cap = cap_elements(cfg)
        self.clock = 0
        self.step_t0 = time.perf_counter()
        self._frames: dict[tuple[int, ...], list[Frame]] = {}
        self._wires: dict[int, torch.Tensor] = {}
        self.last_plan = None
        self.replica_digest = ReplicaDigest()  # its tables and scratch reused per check
        checks.construction_check(self.named, group=group)
        self.ledger.count_check(True)
        self._broadcast_parameters()
        store = store if store is not None else dist.distributed_c10d._get_default_store()
        self.watchdog = Watchdog(store, rank, world_size, cfg.harden.watchdog_s,
                                 namespace_for(store, rank), on_timeout=report,
                                 action=cfg.harden.watchdog_action, events=self.ledger.events)

    def _broadcast_parameters(self) -> None:
        """Rank 0's weights everywhere, as DDP does at construction (one flat broadcast)."""
        if not self.params:
            return
        with torch.no_grad():
            flat = torch.cat([p.detach().reshape(-1) for p in self.params])
            dist.broadcast(flat, 0, group=self.group)
            off = 0
            for p in self.params:
                p.copy_(flat[off:off + p.numel()].view_as(p))
                off += p.numel()

    def frames(self, plan: BucketPlan) -> list[Frame]:
        """The frames of a plan, cached by its order (static plans never change)."""
        got = self._frames.get(plan.order)
        if got is None:
            if len(self._frames) > 64:
                self._frames.clear()  # norm-ema plans change every step: bound the cache
            got = self._frames[plan.order] = cut_frames(plan, self.info, self.cap)
        return got

    def _wire(self, index: int, size: int, device: torch.device) -> torch.Tensor:
        buf = self._wires.get(index)
        if buf is None or buf.numel() != size or buf.device != device:
            dtype = self.policy.dtype_for(self.params[0].dtype if self.params else torch.float32)
            buf = self._wires[index] = torch.empty(size, dtype=dtype, device=device)
        return buf

    def wire_sizes(self) -> list[int]:
        """Elements of every allreduce of a step (gradients + presence + control block)."""
        n_frames = len(cut_frames(make_planner(Planner.STATIC, self.info).plan(None), self.info,
                                  self.cap))
        total = sum(i.numel for i in self.info)
        sizes = [min(self.cap, total - k * self.cap) + block_size(self.world_size)
                 for k in range(n_frames)]
        sizes[-1] += len(self.params)
        return sizes

    # the step protocol --------------------------------------------------------------------
    def begin_step(self, step: int) -> None:
        self.clock = step
        k = self.cfg.replica_check_every
        if k and step % k == 0:
            self.ledger.count_replica_slice()
            try:
                checks.replica_check(self.named, step=step, group=self.group,
                                     digest=self.replica_digest)
            except ConsistencyError:
                self.ledger.count_check(False)
                raise
            self.ledger.count_check(True)
        self.step_t0 = time.perf_counter()

    def _norms(self, grads: Sequence[torch.Tensor | None]) -> list[float | None]:
        present = [g for g in grads if g is not None]
        values = iter(torch.stack(torch._foreach_norm(present)).tolist() if present else [])
        return [None if g is None else next(values) for g in grads]  # one host sync

    def finish_step(self, step: int) -> bool:
        t_start = time.perf_counter()
        grads = [p.grad for p in self.params]
        local = self._norms(grads) if self.planner.needs_local_norms else None
        self.last_plan = self.planner.plan(local)
        frames = self.frames(self.last_plan)
        exponent = self.policy.exponent_for(self.rank)
        device = self.params[0].device
        records, works = [], []
        for frame in frames:
            extra = len(self.params) if frame.index == len(frames) - 1 else 0
            wire = self._wire(frame.index, frame.elements + extra + block_size(self.world_size),
                              device)
            staged = torch.cat([
                grads[pc.param].reshape(-1)[pc.start:pc.stop] if grads[pc.param] is not None
                else torch.zeros(pc.stop - pc.start, device=device) for pc in frame.pieces])
            to_wire(staged, wire[:frame.elements], self.world_size, exponent,
                    self.policy.loss_scaler)
            if extra:
                wire[frame.elements:frame.elements + extra].copy_(
                    torch.tensor([g is not None for g in grads], dtype=wire.dtype))
            block = wire[frame.elements + extra:]
            absent = next((i for i, pc in enumerate(frame.pieces)
                           if grads[pc.param] is None and pc.param in self.required), None)
            write_block(block, self.rank, encode_slot(
                clock=self.clock, bucket=frame.index, digest=frame.digest, scale_exp=exponent,
                ready_s=time.perf_counter() - self.step_t0, absent=absent,
                nonfinite=bool(has_nonfinite(staged))))
            records.append(BucketRecord(frame.index, list(frame.names), frame.elements, block,
                                        wire[:frame.elements]))
            work = dist.all_reduce(wire, group=self.group, async_op=True)
            self.watchdog.issued(self.clock, frame.index, work)
            works.append(work)
        for work, record in zip(works, records):
            try:
                work.wait()
            except Exception as exc:  # a failed collective: the watchdog's diagnosis, if any
                self.watchdog.check(exc)
                raise
            record.flag = finite_sum(record.reduced)  # the wire may overflow under 2^e
        self.watchdog.settled(self.clock)
        comm_done = time.perf_counter()
        last = frames[-1]
        presence = self._wires[last.index][last.elements:last.elements + len(self.params)]
        applied = self.ledger.settle(step, records, sync_ms=(comm_done - t_start) * 1e3,
                                     verify_started=comm_done, presence=presence)
        if applied:
            self._unpack(frames, exponent)
            if self.planner.needs_synced_norms:
                self.planner.observe(self._norms([p.grad for p in self.params]))
        return applied

    def _unpack(self, frames: list[Frame], exponent: int) -> None:
        used = [c != 0 for c in self.ledger.extra]  # presence counts, read in settle's sync
        flat: list[torch.Tensor | None] = []
        for p, u in zip(self.params, used):
            if not u:
                p.grad = None
                flat.append(None)
                continue
            if p.grad is None:
                p.grad = torch.empty_like(p)
            flat.append(p.grad.view(-1))
        for frame in frames:
            avg = from_wire(self._wires[frame.index][:frame.elements], exponent)
            for pc in frame.pieces:
                dest = flat[pc.param]
                if dest is not None:
                    dest[pc.start:pc.stop].copy_(avg[pc.offset:pc.offset + pc.stop - pc.start])

    def close(self) -> None:
        self.watchdog.close()


class Bucketed(SyncStrategy):
    """``bucketed``: the engine above; ``--planner static|norm-ema|norm-ema-agreed``."""

    name = "bucketed"

    def wrap(self, model: nn.Module, ctx: RankInfo) -> nn.Module:
        self.engine = BucketedEngine(model, self.cfg, ctx.rank, ctx.world_size, store=ctx.store,
                                     report=ctx.report_fatal)
        return model

    def begin_step(self, step: int) -> None:
        self.engine.begin_step(step)

    def finish_step(self, step: int) -> bool:
        return self.engine.finish_step(step)

    def step_metrics(self) -> dict:
        return dict(self.engine.ledger.last)

    def summary(self) -> dict:
        return {**self.engine.ledger.summary(), "wire": self.cfg.harden.wire.value,
                "planner": self.cfg.planner.value,
                "frames_per_step": len(self.engine.wire_sizes())}

    def scale_policy(self) -> ScalePolicy | None:
        return self.engine.policy if hasattr(self, "engine") else None

    def close(self, verify: bool = True) -> None:
        if hasattr(self, "engine"):
            self.engine.close()
