"""The fp16 wire composes with a loss scaler, and never writes the wire's inf into the weights.

At its defaults (``scale="loss-scaler"``) the hardened fp16 wire is PyTorch's
``fp16_compress_hook`` bit for bit, so ``torch.amp.GradScaler`` skips, backs off and grows
exactly as under that hook, and the weights end bitwise equal (the step guard sends it through
DDP's built-in C++ fp16 hook, the same cast, divide and sum). An opt-in pre-scale (fixed or
``auto``: the per-bucket guard's) under an enabled GradScaler would scale twice: it is refused
with ``BadInput`` at the first optimizer step the scaler runs, on every rank, before any weight
changes. Without a loss scaler and without ``finish_step`` (the README's loop), a step
that overflows on the wire is skipped on every rank — at the defaults and under an opt-in
pre-scale alike: the gradients are dropped before the optimizer step, the weights stay finite
and unchanged.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import fp16_compress_hook
from torch.nn.parallel import DistributedDataParallel as DDP

from openclaw_ref.sync.base import SyncConfig
from openclaw_ref.sync.errors import BadInput
from openclaw_ref.sync.evidence.ledger import WIRE_OVERFLOW
from openclaw_ref.sync.hardening import harden

STEPS = 20
OVERFLOW_AT = 2


def _ddp() -> DDP:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                          nn.Linear(64, 4))
    return DDP(model, bucket_cap_mb=0.01)


def _batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(8, 16, generator=g) * 4, torch.randint(0, 4, (8,), generator=g)


def _scaled_step(ctx, ddp, opt, scaler, step: int) -> bool:
    """One GradScaler step of the fp16-autocast loss; True when the scaler skipped it (its
    scale backed off). ``scaler.step`` raises what the optimizer step's pre-hooks raise."""
    x, y = _batch(step, ctx.rank)
    with torch.autocast("cpu", dtype=torch.float16):
        loss = F.cross_entropy(ddp(x), y)
    scaler.scale(loss).backward()
    before = scaler.get_scale()
    scaler.step(opt)
    scaler.update()
    opt.zero_grad()
    return scaler.get_scale() < before


def scaled_loop(ctx, arm: str | None) -> dict:
    """20 steps of fp16 autocast + GradScaler, started at 2^24 so the first steps overflow
    and back off, with a short growth interval so the scale also grows and overflows again.
    ``arm``: "fp16_compress_hook", or the hardened fp16 wire's scale (None: its default)."""
    ddp = _ddp()
    if arm == "fp16_compress_hook":
        ddp.register_comm_hook(None, fp16_compress_hook)
        state = None
    else:
        scale = {} if arm is None else {"scale": arm}
        state = harden(ddp, SyncConfig(wire="fp16", **scale), ctx)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 24, growth_interval=3)
    scales, skipped = [], []
    try:
        for step in range(STEPS):
            skipped.append(_scaled_step(ctx, ddp, opt, scaler, step))
            scales.append(scaler.get_scale())
    finally:
        if state is not None:
            state.close()
    return {"scales": scales, "skipped": skipped,
            "params": [p.detach().clone() for p in ddp.parameters()]}


def test_at_defaults_gradscaler_skips_backs_off_and_grows_exactly_as_under_fp16_compress_hook(
        pools):
    pool = pools.get(2)
    reference = pool.run(scaled_loop, "fp16_compress_hook")
    hardened = pool.run(scaled_loop, None)
    for ref, ours in zip(reference, hardened):
        assert ours["scales"] == ref["scales"] and ours["skipped"] == ref["skipped"]
        assert all(torch.equal(a, b) for a, b in zip(ref["params"], ours["params"]))
    assert 0 < sum(reference[0]["skipped"]) < STEPS  # the sequence has skips and clean steps


def refused_loop(ctx, scale: str, enabled: bool) -> dict:
    """``scaled_loop``'s GradScaler (``enabled`` or not) over the fp16 wire pre-scaled by
    ``scale``: the step and error at which it stops (None: it ran to the end), the steps the
    scaler skipped before, and whether any weight had changed by then."""
    ddp = _ddp()
    start = [p.detach().clone() for p in ddp.parameters()]
    state = harden(ddp, SyncConfig(wire="fp16", scale=scale, guard="bucket"), ctx)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 24, growth_interval=3,
                                  enabled=enabled)
    stopped, skipped = None, 0
    try:
        for step in range(STEPS):
            try:
                skipped += _scaled_step(ctx, ddp, opt, scaler, step)
            except BadInput as exc:
                stopped = (step, str(exc))
                break
    finally:
        state.close()
    return {"stopped": stopped, "skipped_before": skipped,
            "unchanged": all(torch.equal(a, b) for a, b in zip(start, ddp.parameters()))}


def test_a_pre_scaled_wire_under_gradscaler_is_refused_on_every_rank_before_a_weight_changes(
        pools):
    for scale in ("auto", "4096"):
        replies = pools.get(2).run(refused_loop, scale, True)
        stops = [r["stopped"] for r in replies]
        assert stops[0] is not None and stops[0] == stops[1], (scale, stops)
        step, message = stops[0]
        assert replies[0]["skipped_before"] == step > 0  # the first step the scaler ran
        assert f"scale={scale!r}" in message and "scale='loss-scaler'" in message
        assert all(r["unchanged"] for r in replies), scale  # every earlier step was skipped


def test_a_pre_scaled_wire_under_a_disabled_gradscaler_runs_unrefused(pools):
    for reply in pools.get(2).run(refused_loop, "auto", False):
        assert reply["stopped"] is None and not reply["unchanged"]


def plain_overflow_loop(ctx, scale: str | None) -> dict:
    """The README's loop (no begin_step/finish_step, no loss scaler) with Adam; at
    OVERFLOW_AT rank 0's loss is multiplied so that the reduced fp16 wire overflows.
    ``scale``: the hardened fp16 wire's (None: its default, under the default step guard; a
    pre-scale is the per-bucket guard's)."""
    ddp = _ddp()
    state = harden(ddp, SyncConfig(wire="fp16", **({} if scale is None else
                                                                 {"scale": scale,
                                                                  "guard": "bucket"})), ctx)
    opt = torch.optim.Adam(ddp.parameters(), lr=1e-3)
    snapshots = []
    try:
        for step in range(4):
            x, y = _batch(step, ctx.rank)
            loss = F.cross_entropy(ddp(x), y)
            if step == OVERFLOW_AT and ctx.rank == 0:
                loss = loss * 1e6
            loss.backward()
            opt.step()
            opt.zero_grad()
            snapshots.append(torch.cat([p.detach().reshape(-1) for p in ddp.parameters()]))
    finally:
        state.close()
    gathered = [torch.empty_like(snapshots[-1]) for _ in range(ctx.world_size)]
    dist.all_gather(gathered, snapshots[-1])
    return {"finite": all(bool(torch.isfinite(s).all()) for s in snapshots),
            "unchanged_by_overflow": torch.equal(snapshots[OVERFLOW_AT - 1],
                                                 snapshots[OVERFLOW_AT]),
            "replicas_equal": all(torch.equal(gathered[0], g) for g in gathered),
            "overflow_steps": [e.step for e in state.events if e.kind == WIRE_OVERFLOW],
            "overflow_rate": state.summary()["overflow_rate_steps"]}


def test_a_wire_overflow_without_finish_step_or_scaler_is_skipped_on_every_rank(pools):
    for scale in (None, "4096", "auto"):
        results = pools.get(2).run(plain_overflow_loop, scale)
        for r in results:
            assert r["finite"] and r["replicas_equal"], (scale, r)
            assert r["unchanged_by_overflow"], (scale, r)  # Adam too: the step was skipped
            assert r["overflow_steps"] == [OVERFLOW_AT], (scale, r)
            assert math.isclose(r["overflow_rate"], 1 / 4)
