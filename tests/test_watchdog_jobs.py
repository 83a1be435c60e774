"""The watchdog in real 2-rank gloo jobs: a long pause on one rank between steps (a checkpoint
save, an evaluation without a barrier) is reported as an alive rank and the job finishes exactly
as without the hook; a rank that never reaches the allreduce is still named — raised in the
training thread under ``RAISE`` (the default), the process ended with exit 4 under ``EXIT``.

Ordering between ranks goes through the store (a rank pauses only once its peer's published beat
shows it waiting in the allreduce; a held-back rank is released by a key), never through sleeps;
the pause itself is a sleep.
"""

from __future__ import annotations

import datetime
import threading
import time

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from openclaw_ref.core.errors import RankFailed
from openclaw_ref.core.launch import LaunchConfig, RankPool
from openclaw_ref.sync.base import SyncConfig, WatchdogAction
from openclaw_ref.sync.errors import SyncTimeout
from openclaw_ref.sync.hardening import harden

STEPS = 4
STOP_AT = 2  # after DDP's bucket rebuild (step 1's forward), which the watchdog does not watch
DEADLINE_S = 1.0
PAUSE_S = 3.5
RELEASED = "test/watchdog-jobs/released"


def _ddp(ctx) -> DDP:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                          nn.Linear(64, 4))
    return DDP(model, bucket_cap_mb=0.01)  # a few buckets


def _step(ctx, ddp: DDP, opt: torch.optim.Optimizer, step: int) -> None:
    g = torch.Generator().manual_seed(1000 * step + ctx.rank)
    x, y = torch.randn(8, 16, generator=g), torch.randint(0, 4, (8,), generator=g)
    F.cross_entropy(ddp(x), y).backward()  # the README's first pattern: no protocol
    opt.step()
    opt.zero_grad()


def _wait_until_waiting(state, peer: int, step: int) -> None:
    """Until ``peer``'s published beat shows it waiting in ``step``'s allreduce."""
    tick = threading.Event()
    while not ((b := state.watchdog.beat_of(peer)) is not None and b.busy
               and b.progress[0] == step):
        tick.wait(0.01)


def paused_job(ctx, sync: SyncConfig) -> dict:
    """The same loop without the hook, then with it and a pause on rank 0 before STOP_AT."""
    plain = _ddp(ctx)
    opt = torch.optim.SGD(plain.parameters(), lr=0.1)
    for step in range(STEPS):
        _step(ctx, plain, opt, step)
    hardened = _ddp(ctx)
    state = harden(hardened, sync, ctx)
    opt = torch.optim.SGD(hardened.parameters(), lr=0.1)
    try:
        for step in range(STEPS):
            if ctx.rank == 0 and step == STOP_AT:
                _wait_until_waiting(state, 1, STOP_AT)
                time.sleep(PAUSE_S)  # saving a checkpoint
            _step(ctx, hardened, opt, step)
    finally:
        state.close()
    return {"equal": all(torch.equal(a, b) for a, b in zip(plain.parameters(),
                                                           hardened.parameters())),
            "events": list(state.events)}


def hung_job(ctx, sync: SyncConfig) -> dict:
    """Rank 1 stops before STOP_AT's allreduce until rank 0 has caught its SyncTimeout."""
    ddp = _ddp(ctx)
    state = harden(ddp, sync, ctx)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    try:
        for step in range(STEPS):
            if ctx.rank == 1 and step == STOP_AT:
                ctx.store.wait([RELEASED], datetime.timedelta(seconds=120))
                return {"error": None}
            _step(ctx, ddp, opt, step)
    except SyncTimeout as exc:
        ctx.store.set(RELEASED, "1")
        return {"error": exc, "backend_error": isinstance(exc.__cause__, RuntimeError)}
    finally:
        state.close()
    return {"error": None}


def test_a_long_pause_on_rank_0_is_reported_as_alive_and_both_ranks_match_no_hook_ddp(pools):
    sync = SyncConfig(watchdog_s=DEADLINE_S)  # the default action
    assert sync.watchdog_action is WatchdogAction.RAISE
    results = pools.get(2).run(paused_job, sync)
    assert all(r["equal"] for r in results)
    assert results[0]["events"] == []
    [event] = results[1]["events"]
    assert event.kind == "SyncTimeout" and event.ranks == [0] and event.step == STOP_AT
    assert (f"rank 0 has not reached step {STOP_AT}'s allreduce" in event.detail
            and f"it is alive, last seen after step {STOP_AT - 1}" in event.detail), event


def test_a_rank_that_never_reaches_the_allreduce_is_raised_naming_it_under_raise():
    sync = SyncConfig(watchdog_s=DEADLINE_S, watchdog_action="raise")
    with RankPool(LaunchConfig(2, backend="gloo", pg_timeout_s=4.0, timeout_s=90)) as pool:
        results = pool.run(hung_job, sync)
    err = results[0]["error"]
    assert isinstance(err, SyncTimeout) and err.ranks == [1] and err.step == STOP_AT
    assert f"it is alive, last seen after step {STOP_AT - 1}" in err.detail
    assert results[0]["backend_error"]  # gloo's own timeout, chained
    assert results[1]["error"] is None


def test_a_rank_that_never_reaches_the_allreduce_ends_the_job_with_exit_4_under_exit():
    sync = SyncConfig(watchdog_s=DEADLINE_S, watchdog_action="exit")
    with RankPool(LaunchConfig(2, backend="gloo", pg_timeout_s=30.0, timeout_s=90)) as pool:
        with pytest.raises(RankFailed) as err:
            pool.run(hung_job, sync)
    assert err.value.rank == 0 and err.value.exit_code == 4
    cause = err.value.cause
    assert isinstance(cause, SyncTimeout) and cause.ranks == [1] and cause.step == STOP_AT
    assert f"it is alive, last seen after step {STOP_AT - 1}" in cause.detail
