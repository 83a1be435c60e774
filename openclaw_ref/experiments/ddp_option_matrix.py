"""The DDP-option matrix: ``harden()`` on a model the suite does not own, beside PyTorch's own
DDP as the oracle.

``harden`` claims to work on any DDP model. This module proves it case by case on ``PlainNet``
(a Conv1d + BatchNorm + MLP, nothing of openclaw) with rank-dependent inputs: every case trains
the same initial weights on the same batches twice on the same ranks — once with stock DDP and
no hook (the oracle), once hardened — and hands both results back for comparison. Cases vary
the DDP options users really set (``find_unused_parameters`` with a rank-dependent unused
branch, ``static_graph``, ``gradient_as_bucket_view``, small buckets so DDP rebuilds them after
iteration 1), ``no_sync`` accumulation, ``join()`` with uneven inputs, frozen parameters,
mixed parameter dtypes, DDP on a sub-group, ``torch.amp.GradScaler`` with fp16 autocast, and
the wire dtype. The same task injects a rank-dependent FP16 pre-scale to show that detection
survives each option. ``conformance/suite/test_ddp_options.py`` asserts on the results.

Nothing here uses the openclaw training loop: the loops below are what a user writes.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from openclaw_ref.sync.base import SyncConfig
from openclaw_ref.sync.errors import ConsistencyError
from openclaw_ref.sync.hardening import harden

IN_CHANNELS, LENGTH, CLASSES = 4, 16, 5
UNIT_ROUNDOFF = {"fp16": 2.0 ** -11, "bf16": 2.0 ** -8}
FP16_TINY = 2.0 ** -24  # fp16's smallest subnormal: the absolute floor of its rounding error


class PlainNet(nn.Module):
    """A small model of the kind users bring: Conv1d, BatchNorm, an MLP head; optionally a
    branch used only on some ranks and steps, a frozen layer, and a float64 layer."""

    def __init__(self, *, branch: bool = False, frozen: bool = False, mixed: bool = False,
                 batchnorm: bool = False) -> None:
        super().__init__()
        self.conv = nn.Conv1d(IN_CHANNELS, 8, 3, padding=1)
        self.norm = nn.BatchNorm1d(8) if batchnorm else nn.Identity()
        self.hidden = nn.Linear(8 * LENGTH, 32)
        self.head = nn.Linear(32, CLASSES)
        self.branch = nn.Linear(32, CLASSES) if branch else None
        self.frozen = nn.Linear(32, 32) if frozen else None
        if self.frozen is not None:
            self.frozen.requires_grad_(False)
        self.extra = nn.Linear(IN_CHANNELS, CLASSES).double() if mixed else None

    def forward(self, x: torch.Tensor, use_branch: bool = False) -> torch.Tensor:
        h = F.relu(self.norm(self.conv(x))).flatten(1)
        h = F.relu(self.hidden(h))
        if self.frozen is not None:
            h = h + self.frozen(h)
        out = self.head(h)
        if self.branch is not None and use_branch:
            out = out + self.branch(h)
        if self.extra is not None:
            out = out + self.extra(x.mean(-1).double()).float()
        return out


@dataclass(frozen=True)
class DDPCase:
    """One row of the matrix. ``ddp`` are DistributedDataParallel keyword arguments."""

    name: str
    ddp: dict[str, Any] = field(default_factory=dict)
    model: dict[str, bool] = field(default_factory=dict)
    wire: str = "native"
    steps: int = 4
    accumulate: int = 1  # micro-batches per step; all but the last under no_sync()
    join: bool = False  # rank r runs steps + r iterations inside ddp.join()
    subgroups: tuple[tuple[int, ...], ...] = ()  # each rank's DDP on the group holding it
    scaler: bool = False  # torch.amp.GradScaler with fp16 autocast
    lr: float = 0.05

    @property
    def branch_used(self) -> bool:
        return bool(self.model.get("branch"))


SMALL_BUCKETS = {"bucket_cap_mb": 0.004}  # several buckets, rebuilt by DDP after iteration 1

CASES: tuple[DDPCase, ...] = (
    DDPCase("defaults (bucket rebuild after iteration 1)", SMALL_BUCKETS),
    DDPCase("find_unused_parameters + rank-dependent unused branch",
            {**SMALL_BUCKETS, "find_unused_parameters": True}, {"branch": True}),
    DDPCase("static_graph", {**SMALL_BUCKETS, "static_graph": True}),
    DDPCase("gradient_as_bucket_view", {**SMALL_BUCKETS, "gradient_as_bucket_view": True}),
    DDPCase("static_graph + gradient_as_bucket_view",
            {**SMALL_BUCKETS, "static_graph": True, "gradient_as_bucket_view": True}),
    DDPCase("no_sync accumulation (3 micro-batches)", SMALL_BUCKETS, accumulate=3),
    DDPCase("join() with uneven inputs", SMALL_BUCKETS, join=True),
    DDPCase("frozen parameters + BatchNorm", SMALL_BUCKETS, {"frozen": True, "batchnorm": True}),
    DDPCase("mixed parameter dtypes (float32 + float64 buckets)", SMALL_BUCKETS, {"mixed": True}),
    DDPCase("sub-group: one DDP group per rank", SMALL_BUCKETS, subgroups=((0,), (1,))),
    DDPCase("GradScaler + fp16 autocast", SMALL_BUCKETS, scaler=True, steps=6),
    DDPCase("wire fp32", SMALL_BUCKETS, wire="fp32"),
    DDPCase("wire fp16", SMALL_BUCKETS, wire="fp16"),
    DDPCase("wire bf16", SMALL_BUCKETS, wire="bf16"),
)

FOUR_RANK_SUBGROUPS = DDPCase("two DDP groups {0,1} and {2,3}", SMALL_BUCKETS,
                              subgroups=((0, 1), (2, 3)))


def batch(step: int, micro: int, rank: int, n: int = 6) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank-dependent inputs: every rank sees other data, every run the same data."""
    g = torch.Generator().manual_seed(10_000 * rank + 100 * step + micro)
    x = torch.randn(n, IN_CHANNELS, LENGTH, generator=g) * (1 + rank)
    y = torch.randint(0, CLASSES, (n,), generator=g)
    return x, y


def _group_for(case: DDPCase, rank: int):
    """Every rank creates every sub-group (``new_group`` is collective), then keeps its own."""
    if not case.subgroups:
        return None
    mine = None
    for ranks in case.subgroups:
        pg = dist.new_group(list(ranks))
        if rank in ranks:
            mine = pg
    return mine


def _iterations(case: DDPCase, rank: int) -> int:
    return case.steps + (rank if case.join else 0)


def _train(ddp: DDP, case: DDPCase, rank: int) -> dict:
    """The user's loop: forward/backward (no_sync for all but the last micro-batch),
    optimizer step; GradScaler and join() as their docs show. Returns what was seen."""
    opt = torch.optim.SGD(ddp.parameters(), lr=case.lr)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 24) if case.scaler else None
    scales: list[float] = []
    context = ddp.join() if case.join else contextlib.nullcontext()
    with context:
        for step in range(_iterations(case, rank)):
            for micro in range(case.accumulate):
                x, y = batch(step, micro, rank)
                sync = micro == case.accumulate - 1
                with (contextlib.nullcontext() if sync else ddp.no_sync()):
                    with torch.autocast("cpu", dtype=torch.float16, enabled=scaler is not None):
                        out = ddp(x, use_branch=case.branch_used and (step + rank) % 2 == 0)
                        loss = F.cross_entropy(out, y) / case.accumulate
                    (scaler.scale(loss) if scaler else loss).backward()
            if scaler is not None:
                scaler.step(opt)
                scaler.update()
                scales.append(float(scaler.get_scale()))
            else:
                opt.step()
            opt.zero_grad(set_to_none=True)
    return {"params": {n: p.detach().clone() for n, p in ddp.module.named_parameters()},
            "scales": scales}


def _build(case: DDPCase, group) -> DDP:
    torch.manual_seed(0)
    model = PlainNet(**case.model)
    return DDP(model, process_group=group, **case.ddp)


def local_gradients(case: DDPCase, rank: int) -> dict[str, torch.Tensor]:
    """This rank's own gradients of the first step (no DDP): the terms of the average, from
    which the rounding bound of a narrow wire is derived."""
    torch.manual_seed(0)
    model = PlainNet(**case.model)
    x, y = batch(0, 0, rank)
    F.cross_entropy(model(x, use_branch=case.branch_used and rank % 2 == 0), y).backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def first_step_gradients(ddp: DDP, case: DDPCase, rank: int) -> dict[str, torch.Tensor]:
    x, y = batch(0, 0, rank)
    F.cross_entropy(ddp(x, use_branch=case.branch_used and rank % 2 == 0), y).backward()
    grads = {n: p.grad.clone() for n, p in ddp.module.named_parameters() if p.grad is not None}
    ddp.zero_grad(set_to_none=True)
    return grads


def ddp_case_task(ctx, case: DDPCase) -> dict:
    """One case on one rank of a pool (``ctx``: any object with ``rank``): oracle, hardened,
    and the fault run. Returns tensors on CPU and the hardened run's counters."""
    rank = ctx.rank
    group = _group_for(case, rank)
    oracle = _train(_build(case, group), case, rank)
    # replica_slices=1: every parameter compared at every step, so a false alarm that any K
    # could raise (K only picks which parameters a step compares) shows here
    sync = SyncConfig(wire=case.wire, nonfinite="skip" if case.scaler else "raise",
                      replica_slices=1, guard=_guard(case))
    ddp = _build(case, group)
    state = harden(ddp, sync, ctx)
    reply: dict[str, Any] = {"rank": rank, "oracle": oracle, "error": None}
    try:
        if case.wire in UNIT_ROUNDOFF:
            reply["grads_oracle"] = first_step_gradients(_build(case, group), case, rank)
            reply["grads_hardened"] = first_step_gradients(ddp, case, rank)
            reply["grads_local"] = local_gradients(case, rank)
            # the hardened DDP saw one extra backward: rebuild it so both train from step 0
            state.close()
            ddp = _build(case, group)
            state = harden(ddp, sync, ctx)
        reply["hardened"] = _train(ddp, case, rank)
    except ConsistencyError as exc:
        reply["error"] = exc
    reply["summary"] = state.summary()
    reply["events"] = [e.to_json() for e in state.events]
    state.close()
    reply["fault"] = _fault_run(ctx, case, group)
    return reply


def _guard(case: DDPCase) -> str:
    """harden()'s default guard, but for a bf16 wire, which only the per-bucket guard sends."""
    return "bucket" if case.wire == "bf16" else "step"


def _fault_run(ctx, case: DDPCase, group) -> ConsistencyError | None:
    """Group rank 1's own gradient of ``head.weight`` turns NaN at step 1, under
    ``nonfinite="raise"``: the guard must name that rank, under every DDP option (stock DDP
    averages the NaN into every replica, silently). Singleton groups have no one to compare
    with: not run."""
    if group is not None and dist.get_world_size(group) < 2:
        return None
    sync = SyncConfig(nonfinite="raise", guard=_guard(case))
    ddp = _build(dataclasses.replace(case, scaler=False), group)
    state = harden(ddp, sync, ctx)
    seen = {"backwards": 0}

    def poison(grad: torch.Tensor) -> torch.Tensor:
        seen["backwards"] += 1
        return grad * float("nan") if seen["backwards"] == 1 + case.accumulate else grad

    group_rank = dist.get_rank(group) if group is not None else ctx.rank
    handle = ddp.module.head.weight.register_hook(poison) if group_rank == 1 else None
    try:
        _train(ddp, dataclasses.replace(case, scaler=False, steps=2, join=False), ctx.rank)
    except ConsistencyError as exc:
        return exc
    finally:
        if handle is not None:
            handle.remove()
        state.close()
    return None


def relative_error(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """max over tensors of ‖a − b‖∞ / max(‖b‖∞, tiny)."""
    worst = 0.0
    for n in b:
        scale = max(float(b[n].abs().max()), 1e-30)
        worst = max(worst, float((a[n].double() - b[n].double()).abs().max()) / scale)
    return worst


def narrow_wire_excess(hardened: dict[str, torch.Tensor], oracle: dict[str, torch.Tensor],
                       local_terms: list[dict[str, torch.Tensor]], wire: str) -> float:
    """How far the narrow-wire average exceeds its rounding bound (<= 0: inside it).

    Each of the W terms g_r / W is rounded once by the cast (relative error u), and the
    W-term sum rounds at most W − 1 more times, each within u of the partial sum, so
    |ĝ − ḡ| ≤ (2W − 1)·u·Σ_r |g_r| / W + W·tiny, where tiny bounds the absolute error of
    subnormal results (fp16). The oracle's own fp32 rounding is far below this."""
    u = UNIT_ROUNDOFF[wire]
    world = len(local_terms)
    tiny = FP16_TINY if wire == "fp16" else 0.0
    worst = -math.inf
    for n in oracle:
        mass = sum(t[n].double().abs() for t in local_terms) / world
        bound = (2 * world - 1) * u * mass + world * tiny + 1e-7 * oracle[n].double().abs()
        excess = (hardened[n].double() - oracle[n].double()).abs() - bound
        worst = max(worst, float(excess.max()))
    return worst



def hook_parity_task(ctx, on_new_group: bool, iterations: int = 20) -> list[tuple[float, ...]]:
    """PyTorch's ``_test_ddp_hook_parity`` body (``distributed_test.py``; GPU-gated there),
    on gloo: ``Linear(1, 5)``, rank r feeds ``[r]``, gradients accumulate with manual zeroing,
    no optimizer. Per iteration: (expected mean of ranks, no-hook DDP, PyTorch's
    ``allreduce_hook``, hardened) for weight[0, 0]. ``on_new_group``: DDP and hook on a
    ``new_group`` of every rank (``test_ddp_hook_parity_allreduce_process_group``)."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    group = dist.new_group(list(range(ctx.world_size))) if on_new_group else None
    torch.manual_seed(0)
    m = nn.Linear(1, 5)
    plain = DDP(copy.deepcopy(m), process_group=group)
    torch_hook = DDP(copy.deepcopy(m), process_group=group)
    torch_hook.register_comm_hook(group, default_hooks.allreduce_hook)
    hardened = DDP(copy.deepcopy(m), process_group=group)
    state = harden(hardened, SyncConfig(nonfinite="raise"), ctx)
    expected = sum(range(ctx.world_size)) / ctx.world_size
    rows = []
    try:
        for _ in range(iterations):
            row = [expected]
            for net in (plain, torch_hook, hardened):
                g = net.module.weight.grad
                if g is not None:
                    g.requires_grad_(False)
                    g.zero_()
                net(torch.tensor([float(ctx.rank)])).sum().backward()
                row.append(float(net.module.weight.grad[0, 0]))
            rows.append(tuple(row))
    finally:
        state.close()
    return rows
