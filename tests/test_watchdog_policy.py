"""The watchdog's policy on one process: a late rank that is alive between steps is reported as
such and never raised; a silent one is raised in the training thread under ``RAISE``; ``REPORT``
only records; a failing store never stops the thread.

Peers are real ``Watchdog`` objects on a loopback TCPStore (each beats from its own thread); the
collective is a stand-in ``Work`` that completes when the test says so. Every wait is on an
observed state (an event recorded, a beat published), never on elapsed time.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest
import torch
import torch.distributed as dist

from openclaw_ref.sync.base import SyncConfig, WatchdogAction
from openclaw_ref.sync.errors import BadInput, SyncTimeout
from openclaw_ref.sync.evidence.watchdog import BLIND, SIGHTED, Watchdog
from tests.helpers import loopback_store

DEADLINE_S = 0.3


class Work:
    """A collective that completes when the test calls ``finish``."""

    def __init__(self) -> None:
        self.finished = threading.Event()

    def is_completed(self) -> bool:
        return self.finished.is_set()

    def get_future(self):
        fut = torch.futures.Future()
        fut.set_result([])
        return fut


class FlakyStore:
    """A store whose every operation fails while ``failing`` is set (a store outage)."""

    def __init__(self, store: dist.Store) -> None:
        self.store = store
        self.failing = threading.Event()
        self.failures = 0

    def _op(self, name: str):
        def call(*args):
            if self.failing.is_set():
                self.failures += 1
                raise RuntimeError("store unreachable (injected)")
            return getattr(self.store, name)(*args)
        return call

    def clone(self) -> FlakyStore:
        return self

    def __getattr__(self, name: str):
        return self._op(name)


@pytest.fixture
def store():
    return loopback_store(10)


def until(condition: Callable[[], bool], timeout_s: float = 20.0) -> None:
    """Wait until ``condition()`` holds (polled), failing the test after ``timeout_s``."""
    tick = threading.Event()
    for _ in range(int(timeout_s / 0.01)):
        if condition():
            return
        tick.wait(0.01)
    raise AssertionError("condition never held")


def dog(store, rank: int, ns: str, action=WatchdogAction.RAISE, **kw) -> Watchdog:
    """A watchdog that never ends the test's process: a peer's failure note (``job_end``) or
    an ``EXIT`` calls ``on_timeout``, here a no-op unless the test passes its own."""
    kw.setdefault("on_timeout", lambda exc: None)
    return Watchdog(store, rank, 2, DEADLINE_S, ns, tick_s=0.02, action=action, **kw)


def a_peer_after_step(store, ns: str, step: int) -> Watchdog:
    """Rank 1, alive and between steps: it settled ``step`` and issued nothing since."""
    peer = dog(store, 1, ns)
    done = Work()
    done.finished.set()
    peer.issued(step, 3, done)
    peer.settled(step)
    until(lambda: (b := peer.beat_of(1)) is not None and b.settled == step)
    return peer


def test_a_late_rank_alive_between_steps_is_reported_as_alive_and_never_raised(store):
    peer = a_peer_after_step(store, "alive", 1)
    me = dog(store, 0, "alive")
    work = Work()
    me.issued(2, 0, work)
    try:
        until(lambda: me.events)
        until(lambda: me._count > 3 * DEADLINE_S / me.tick_s)  # three deadlines later …
        me.check()  # … still nothing raised: the rank is alive
        work.finished.set()
        me.check()
    finally:
        me.close()
        peer.close()
    [event] = me.events
    assert event.kind == "SyncTimeout" and event.ranks == [1] and event.step == 2
    assert "rank 1 has not reached step 2's allreduce" in event.detail
    assert "it is alive, last seen after step 1 (no collective in flight)" in event.detail


QUEUED_DEADLINE_S = 1.0  # ≫ the three ticks the queued collective is left to wait


def _queued_behind_a_late_rank(store, ns: str) -> tuple[Watchdog, Watchdog, Work]:
    """Rank 0 issued buckets 0 and 1 of step 2 while rank 1 was between steps; rank 0's
    watchdog reported bucket 0; then rank 1 issued both and bucket 0 completed. Returns
    (rank 0's watchdog, rank 1's, bucket 1's work, still in flight)."""
    peer = a_peer_after_step(store, ns, 1)
    me = Watchdog(store, 0, 2, QUEUED_DEADLINE_S, ns, tick_s=0.02)
    first, second = Work(), Work()
    me.issued(2, 0, first)
    me.issued(2, 1, second)
    until(lambda: me.events)
    arrived = Work()
    arrived.finished.set()
    peer.issued(2, 1, arrived)
    until(lambda: (b := peer.beat_of(1)) is not None and b.progress == (2, 1))
    first.finished.set()
    until(lambda: (2, 0) not in me._inflight)
    return me, peer, second


def test_a_collective_queued_behind_a_late_ranks_one_is_not_reported_again_as_slow(store):
    """Bucket 1 waited behind bucket 0 as long as rank 1 was late: its deadline counts from
    bucket 0's completion, so completing soon after is no second report."""
    me, peer, second = _queued_behind_a_late_rank(store, "queued")
    try:
        ticks = me._count
        until(lambda: me._count >= ticks + 3)
        second.finished.set()
        until(lambda: not me._inflight)
    finally:
        me.close()
        peer.close()
    [event] = me.events
    assert event.bucket == 0 and event.ranks == [1] and "it is alive" in event.detail


def test_a_queued_collective_still_waiting_a_deadline_after_the_one_ahead_is_reported(store):
    me, peer, second = _queued_behind_a_late_rank(store, "queued-slow")
    try:
        until(lambda: len(me.events) == 2)
        second.finished.set()
    finally:
        me.close()
        peer.close()
    assert me.events[1].bucket == 1 and me.events[1].ranks == []
    assert "every rank has reached it: the collective itself is slow" in me.events[1].detail


def test_a_rank_whose_heartbeat_stops_turns_silent_and_is_raised_in_the_training_thread(store):
    peer = a_peer_after_step(store, "frozen", 1)
    me = dog(store, 0, "frozen")
    me.issued(2, 0, Work())
    try:
        until(lambda: me.events)
        peer.close()  # its process freezes: no more beats
        until(lambda: len(me.events) == 2)
        with pytest.raises(SyncTimeout) as err:
            me.check()
        with pytest.raises(SyncTimeout):  # every later entry raises it too
            me.check()
    finally:
        me.close()
    assert "alive" in me.events[0].detail
    assert err.value.ranks == [1] and err.value.step == 2 and err.value.bucket == 0
    assert "no heartbeat for" in err.value.detail and "frozen, dead or cut off" in err.value.detail


def test_a_failed_collective_raises_the_diagnosis_chained_to_the_backends_error(store):
    peer = a_peer_after_step(store, "failed", 1)
    me = dog(store, 0, "failed")
    me.issued(2, 0, Work())
    gloo = RuntimeError("Timed out waiting 4000ms for recv operation to complete")
    try:
        until(lambda: me.events)
        with pytest.raises(SyncTimeout) as err:
            me.check(gloo)
    finally:
        me.close()
        peer.close()
    assert err.value.__cause__ is gloo and err.value.ranks == [1]
    assert "alive, last seen after step 1" in err.value.detail


def test_an_error_after_the_diagnosed_collective_succeeded_is_left_to_its_caller(store):
    peer = a_peer_after_step(store, "unrelated", 1)
    me = dog(store, 0, "unrelated")
    work = Work()
    me.issued(2, 0, work)
    try:
        until(lambda: me.events)
        work.finished.set()  # the late rank arrived; then some check fails for its own reason
        me.check(RuntimeError("a consistency check of step 2"))
        me.check()
    finally:
        me.close()
        peer.close()


def test_report_records_a_silent_rank_once_and_never_raises(store):
    me = dog(store, 0, "report", WatchdogAction.REPORT)
    me.issued(0, 0, Work())  # rank 1 never published: silent from the start
    try:
        until(lambda: me.events)
        until(lambda: me._count > 3 * DEADLINE_S / me.tick_s)
        me.check()
        me.check(RuntimeError("gloo timeout"))  # nothing to add: the caller re-raises its own
    finally:
        me.close()
    [event] = me.events
    assert event.ranks == [1] and "never published a heartbeat" in event.detail


def test_a_store_outage_is_recorded_once_and_the_watchdog_keeps_watching(store):
    flaky = FlakyStore(store)
    flaky.failing.set()
    fired: list[BaseException] = []
    me = dog(flaky, 0, "flaky", WatchdogAction.EXIT, on_timeout=fired.append)
    try:
        until(lambda: flaky.failures >= 4)  # retried with back-off, not given up
        assert me._thread.is_alive()
        flaky.failing.clear()
        until(lambda: any(e.kind == SIGHTED for e in me.events))
        me.issued(0, 0, Work())
        until(lambda: fired)
    finally:
        me.close()
    kinds = [e.kind for e in me.events]
    assert kinds.count(BLIND) == 1 and kinds.count(SIGHTED) == 1
    assert "store unreachable (injected)" in me.events[0].detail
    assert isinstance(fired[0], SyncTimeout) and fired[0].ranks == [1]


def test_an_error_inside_the_round_does_not_end_the_thread(store):
    class Broken(Work):
        def is_completed(self) -> bool:
            raise RuntimeError("backend gone")

    me = dog(store, 0, "broken", WatchdogAction.REPORT)
    me.issued(0, 0, Broken())
    try:
        until(lambda: any(e.kind == BLIND for e in me.events))
        count = me._count
        until(lambda: me._count > count + 2)
    finally:
        me.close()
    assert "backend gone" in me.events[0].detail


def test_the_action_is_a_config_choice_and_a_wrong_one_is_bad_input():
    assert SyncConfig().watchdog_action is WatchdogAction.RAISE
    assert SyncConfig(watchdog_action="exit").watchdog_action is WatchdogAction.EXIT
    with pytest.raises(BadInput, match="--watchdog-action must be one of raise, report, exit"):
        SyncConfig(watchdog_action="kill")
