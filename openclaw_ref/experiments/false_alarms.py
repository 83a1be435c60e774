"""The false-alarm corpus: healthy jobs that a guard must neither stop nor change, and faults it
must name for what they are — each run three ways on the same ranks and batches.

Every ``Pattern`` is a user's loop on a tiny MLP (rank-dependent inputs), run as

  * the **reference**: what a correct job computes — stock DDP, no hook, without the pattern's
    disturbance (no checkpointing, no pause; for an fp16 pattern PyTorch's
    ``fp16_compress_hook``, the stock fp16 wire; for the overflow pattern that loop with the
    overflowed step's optimizer step skipped, since its gradients hold inf);
  * **stock DDP**: the pattern as written, on stock DDP (``fp16_compress_hook`` for fp16);
  * **hardened**: the pattern as written, on ``harden(ddp)`` at its defaults (the pattern's own
    settings: a wire, a scale; for the pause a deadline of ``PAUSE_DEADLINE_S`` instead of the
    default 60 s, so the row runs in seconds, under the default action — what a user gets: the
    pause is reported by the waiting ranks, nobody is stopped).

``judge`` turns each arm's replies into an ``Outcome``: a healthy pattern is ``EXACT`` (every
rank's parameters equal to the reference's — bitwise at 2 ranks; beyond, within
``RELATIVE_LIMIT``, or ``FP16_RELATIVE_LIMIT`` for an fp16 wire — and, under a loss scaler, the
same scale sequence exactly), ``DIFFERS``, ``NON_FINITE``
weights, a ``FALSE_ALARM`` (an exception) or ``KILLED`` (a rank process ended). A fault pattern
is ``RIGHT_CAUSE`` (the error it must raise, on every rank at the same step, with the rank and
no invented majority), ``MISDIAGNOSED``, ``SILENT`` or ``KILLED``. A refused pattern (a
combination ``harden()`` rejects: a pre-scaled fp16 wire under GradScaler, ``precision``) is
``RIGHT_CAUSE`` when every rank raised ``BadInput`` at the same step; on an arm that does not
refuse it (stock DDP) it is judged as a healthy one.
Nothing is typed in: every outcome is measured; ``max_relative`` is the measured distance.
``conformance/suite/test_false_alarms.py`` asserts on it; the ``false_alarms`` compare section
publishes it.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import fp16_compress_hook
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.checkpoint import checkpoint

from openclaw_ref.sync.base import SyncConfig
from openclaw_ref.sync.hardening import harden

RELATIVE_LIMIT = 1e-6  # beyond 2 ranks: the summation order may differ from stock DDP's
# Beyond 2 ranks on an fp16 wire: gloo's ring splits a buffer by its length, and the hardened
# last bucket is longer (its control block rides at the tail), so its elements are summed in
# another order in fp16 — each such reduced gradient within (W − 1)·2^-11 relative of
# fp16_compress_hook's; the weights, moved by lr × that on the applied steps, stay far inside
# 2^-11 relative (measured at 4 ranks: 5.5e-5, 96 of 6,657 weights).
FP16_RELATIVE_LIMIT = 2.0 ** -11
PAUSE_DEADLINE_S = 1.0  # the hardened arm's watchdog deadline in the pause pattern (CI-sized)
PAUSE_S = 2.5  # rank 0's pause between two steps: longer than that deadline
# The pause comes before this step: after step 1, whose forward holds DDP's bucket-rebuild
# broadcast (a collective the watchdog does not watch), so the others wait in a bucket's
# allreduce, where the watchdog sees them wait and must diagnose rank 0 as alive.
PAUSE_BEFORE = 2
OVERFLOW_AT = 2  # the step whose loss rank 0 multiplies by OVERFLOW_FACTOR
OVERFLOW_FACTOR = 1e6  # local gradients ≫ 65504: the fp16 wire overflows
BUCKET_MB = 0.004  # several buckets, so some become ready inside a checkpoint's backward


class Pattern(enum.StrEnum):
    """A row of the corpus: eight healthy jobs, one fault."""

    REENTRANT = "reentrant checkpointing"
    REENTRANT_STATIC = "reentrant checkpointing + static_graph"
    NON_REENTRANT = "non-reentrant checkpointing"
    NON_REENTRANT_STATIC = "non-reentrant checkpointing + static_graph"
    RANK0_PAUSE = "rank 0 pauses longer than the watchdog deadline between steps"
    SCALER_FP16 = "GradScaler + fp16 wire (default scale)"
    SCALER_FP16_AUTO = "GradScaler + fp16 wire pre-scaled (scale auto, per-bucket guard): refused"
    OVERFLOW_PLAIN = "fp16 wire overflow, plain loop (no finish_step, no scaler)"
    TWO_RANKS_DISAGREE = "two ranks disagree: rank 0's step counter runs ahead"


class Arm(enum.StrEnum):
    REFERENCE = "reference"
    STOCK = "stock DDP"
    HARDENED = "hardened"


class Outcome(enum.StrEnum):
    EXACT = "exact"
    DIFFERS = "differs"
    NON_FINITE = "non-finite weights"
    FALSE_ALARM = "false alarm"
    KILLED = "killed"
    RIGHT_CAUSE = "right cause"
    MISDIAGNOSED = "misdiagnosed"
    SILENT = "silent"


@dataclass(frozen=True)
class Spec:
    """How a pattern's loop differs from the plain one."""

    checkpoint: bool | None = None  # None: no checkpointing; else use_reentrant
    static_graph: bool = False
    pause: bool = False
    scaler: bool = False
    fp16: bool = False  # the stock arm uses fp16_compress_hook, the hardened one wire="fp16"
    scale: str | None = None  # the hardened fp16 wire's scale (None: its default)
    overflow: bool = False
    clock_fault: bool = False
    steps: int = 4


SPECS: dict[Pattern, Spec] = {
    Pattern.REENTRANT: Spec(checkpoint=True),
    Pattern.REENTRANT_STATIC: Spec(checkpoint=True, static_graph=True),
    Pattern.NON_REENTRANT: Spec(checkpoint=False),
    Pattern.NON_REENTRANT_STATIC: Spec(checkpoint=False, static_graph=True),
    Pattern.RANK0_PAUSE: Spec(pause=True, steps=4),
    Pattern.SCALER_FP16: Spec(scaler=True, fp16=True, steps=8),
    # 12 steps: the scaler and the pre-scale back off together until the first clean step
    # (step 9 here), the first the scaler runs, where the combination is refused
    Pattern.SCALER_FP16_AUTO: Spec(scaler=True, fp16=True, scale="auto", steps=12),
    Pattern.OVERFLOW_PLAIN: Spec(fp16=True, overflow=True),
    Pattern.TWO_RANKS_DISAGREE: Spec(clock_fault=True, steps=3),
}
FAULTS = (Pattern.TWO_RANKS_DISAGREE,)
REFUSED = (Pattern.SCALER_FP16_AUTO,)


class BlockNet(nn.Module):
    """Input layer, three residual blocks (optionally checkpointed), a head."""

    def __init__(self, reentrant: bool | None, width: int = 32) -> None:
        super().__init__()
        self.reentrant = reentrant
        self.inp = nn.Linear(8, width)
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Linear(width, width), nn.Tanh(), nn.Linear(width, width))
            for _ in range(3))
        self.out = nn.Linear(width, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)  # (B, width)
        for block in self.blocks:
            h = h + (block(h) if self.reentrant is None
                     else checkpoint(block, h, use_reentrant=self.reentrant))
        return self.out(h)  # (B, 1)


def _batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(16, 8, generator=g) * (1 + rank), torch.randn(16, 1, generator=g)


def _build(spec: Spec, arm: Arm) -> DDP:
    torch.manual_seed(0)
    disturbed = arm is not Arm.REFERENCE
    ddp = DDP(BlockNet(spec.checkpoint if disturbed else None), bucket_cap_mb=BUCKET_MB,
              static_graph=spec.static_graph)
    if spec.fp16 and arm is not Arm.HARDENED:
        ddp.register_comm_hook(None, fp16_compress_hook)
    return ddp


def hardened_config(spec: Spec) -> SyncConfig:
    """The hardened arm's config: the defaults, but for the pattern's wire and scale (a
    pre-scale is the per-bucket guard's: the only one that sends one) and, for the pause, the
    deadline (never the watchdog's action)."""
    extra: dict[str, Any] = {}
    if spec.fp16:
        extra["wire"] = "fp16"
    if spec.scale is not None:
        extra["scale"] = spec.scale
        extra["guard"] = "bucket"
    if spec.pause:
        extra["watchdog_s"] = PAUSE_DEADLINE_S  # the default action: raise, never kill
    return SyncConfig(**extra)


def _loop(ddp: DDP, spec: Spec, arm: Arm, rank: int, state, at: dict) -> dict:
    """The user's loop; the scaler's scale after every step. ``at["step"]``: the step it is in
    (read when it raises)."""
    opt = torch.optim.SGD(ddp.parameters(), lr=0.02)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 20, growth_interval=2) \
        if spec.scaler else None
    scales: list[float] = []
    for step in range(spec.steps):
        at["step"] = step
        if spec.pause and arm is not Arm.REFERENCE and rank == 0 and step == PAUSE_BEFORE:
            time.sleep(PAUSE_S)  # the disturbance itself (a checkpoint save), not an ordering
        if state is not None and spec.clock_fault:
            state.begin_step(step + (1 if rank == 0 else 0))
        x, y = _batch(step, rank)
        with torch.autocast("cpu", dtype=torch.float16, enabled=scaler is not None):
            loss = F.mse_loss(ddp(x), y)
        if spec.overflow and step == OVERFLOW_AT and rank == 0:
            loss = loss * OVERFLOW_FACTOR
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            scales.append(float(scaler.get_scale()))
        else:
            loss.backward()
            if state is not None and spec.clock_fault:
                state.finish_step(step + (1 if rank == 0 else 0))
            if not (arm is Arm.REFERENCE and spec.overflow and step == OVERFLOW_AT):
                opt.step()
        opt.zero_grad(set_to_none=True)
    return {"scales": scales}


def arm_task(ctx, pattern: Pattern, arm: Arm) -> dict:
    """One arm of one pattern on one rank: its parameters (flat), scales, error and events."""
    spec = SPECS[pattern]
    ddp = _build(spec, arm)
    state = harden(ddp, hardened_config(spec), ctx) if arm is Arm.HARDENED else None
    reply: dict[str, Any] = {"rank": ctx.rank, "error": None, "scales": [], "events": [],
                             "timeouts": []}
    at: dict[str, int] = {}
    t0 = time.perf_counter()
    try:
        reply.update(_loop(ddp, spec, arm, ctx.rank, state, at))
    except Exception as exc:  # judged by the caller: a false alarm, or the fault's diagnosis
        reply["error"] = {"kind": type(exc).__name__, "message": str(exc)[:500],
                          "ranks": list(getattr(exc, "ranks", [])), "step": at.get("step")}
    reply["seconds"] = time.perf_counter() - t0
    if state is not None:
        reply["events"] = [e.kind for e in state.events]
        reply["timeouts"] = [e.detail for e in state.events if e.kind == "SyncTimeout"]
        state.close()
    reply["params"] = torch.cat([p.detach().reshape(-1) for p in ddp.module.parameters()])
    return reply


def relative_distance(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a − b| / max |b|: how far weights ``a`` are from the reference's ``b``."""
    scale = max(float(b.abs().max()), 1e-30)
    return float((a.double() - b.double()).abs().max()) / scale


def max_relative(replies: list[dict] | None, reference: list[dict] | None) -> float | None:
    """The largest ``relative_distance`` of any rank's weights to the reference's (None when
    an arm did not finish or raised, or its weights are not finite)."""
    if replies is None or reference is None or any(r["error"] for r in replies):
        return None
    if any(not bool(torch.isfinite(r["params"]).all()) for r in replies):
        return None
    return max(relative_distance(r["params"], ref["params"])
               for r, ref in zip(replies, reference))


def _equal(a: torch.Tensor, b: torch.Tensor, world_size: int, limit: float) -> bool:
    """Bitwise at 2 ranks (the same summation as stock DDP); beyond, within ``limit``."""
    if world_size <= 2:
        return torch.equal(a, b)
    return relative_distance(a, b) <= limit


def judge(pattern: Pattern, replies: list[dict] | None, reference: list[dict] | None) -> Outcome:
    """The arm's outcome (module docstring); ``replies`` None: a rank process ended."""
    if replies is None:
        return Outcome.KILLED
    errors = [r["error"] for r in replies if r["error"] is not None]
    if pattern in FAULTS:
        return _diagnosis(errors, len(replies))
    if pattern in REFUSED and errors:
        return _refusal(errors, len(replies))
    if errors:
        return Outcome.FALSE_ALARM
    if any(not bool(torch.isfinite(r["params"]).all()) for r in replies):
        return Outcome.NON_FINITE
    if reference is None:
        return Outcome.DIFFERS
    # beyond 2 ranks an fp16 wire is held to 2^-11, not 1e-6: FP16_RELATIVE_LIMIT says why
    limit = FP16_RELATIVE_LIMIT if SPECS[pattern].fp16 else RELATIVE_LIMIT
    same = all(_equal(r["params"], ref["params"], len(replies), limit)
               and r["scales"] == ref["scales"] for r, ref in zip(replies, reference))
    return Outcome.EXACT if same else Outcome.DIFFERS


def _diagnosis(errors: list[dict], world_size: int) -> Outcome:
    """Rank 0's clock ran ahead: every rank must raise ClockMismatch; with two ranks (no
    majority) the message gives both clocks and claims no majority."""
    if not errors:
        return Outcome.SILENT
    right = (len(errors) == world_size and _same_step(errors)
             and all(e["kind"] == "ClockMismatch" for e in errors)
             and all("rank 0: step" in e["message"] for e in errors)
             and (world_size > 2 or all("no majority" in e["message"]
                                        and "most" not in e["message"] for e in errors)))
    return Outcome.RIGHT_CAUSE if right else Outcome.MISDIAGNOSED


def _same_step(errors: list[dict]) -> bool:
    return len({e["step"] for e in errors}) == 1


def _refusal(errors: list[dict], world_size: int) -> Outcome:
    """A pre-scaled fp16 wire under GradScaler: every rank refuses it with ``BadInput`` at the
    same step (the first the scaler runs), naming the setting to use instead."""
    right = (len(errors) == world_size and _same_step(errors)
             and all(e["kind"] == "BadInput" and "GradScaler" in e["message"]
                     and "scale='loss-scaler'" in e["message"] for e in errors))
    return Outcome.RIGHT_CAUSE if right else Outcome.MISDIAGNOSED
