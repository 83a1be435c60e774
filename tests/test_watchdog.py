"""The watchdog decides from ``Work.is_completed()``, never from a future's completion.

NCCL completes a collective's future when its kernel is enqueued; only the ``Work`` knows
whether the collective finished. These tests hand the watchdog a work whose future is already
done but which has not completed — NCCL's state during a hang — and show it still fires, naming
the rank that never published progress. The store is a real c10d TCPStore on loopback; the
multi-process gloo hang is in ``test_hardened_faults.py``.
"""

from __future__ import annotations

import threading

import pytest
import torch

from openclaw_ref.sync.base import WatchdogAction
from openclaw_ref.sync.errors import SyncTimeout
from openclaw_ref.sync.evidence.watchdog import Watchdog
from tests.helpers import loopback_store


class EnqueuedWork:
    """A collective as NCCL reports it mid-hang: its future is done, the work is not."""

    def __init__(self) -> None:
        self.future = torch.futures.Future()
        self.future.set_result([torch.zeros(1)])
        self.finished = threading.Event()

    def get_future(self) -> torch.futures.Future:
        return self.future

    def is_completed(self) -> bool:
        return self.finished.is_set()


@pytest.fixture
def store():
    s = loopback_store(10)
    yield s


def _watchdog(store, fired: list, done: threading.Event, ns: str) -> Watchdog:
    def report(exc: BaseException) -> None:
        fired.append(exc)
        done.set()

    return Watchdog(store, rank=0, world_size=2, deadline_s=0.2, namespace=ns,
                    on_timeout=report, tick_s=0.02, action=WatchdogAction.EXIT)


def test_a_work_whose_future_is_done_but_which_never_completes_fires_naming_the_absent_rank(
        store):
    fired: list = []
    done = threading.Event()
    dog = _watchdog(store, fired, done, "t1")
    work = EnqueuedWork()
    assert work.get_future().done()
    dog.issued(0, 0, work)
    try:
        assert done.wait(10), "the watchdog never fired"
    finally:
        dog.close()
    assert isinstance(fired[0], SyncTimeout)
    assert fired[0].ranks == [1] and fired[0].step == 0 and fired[0].bucket == 0


def test_a_completed_work_is_forgotten_and_never_fires(store):
    fired: list = []
    done = threading.Event()
    dog = _watchdog(store, fired, done, "t2")
    work = EnqueuedWork()
    work.finished.set()
    dog.issued(0, 0, work)
    try:
        forgotten = threading.Event()
        while not forgotten.wait(0.01):  # until the thread has polled the work and dropped it
            with dog._lock:
                if not dog._inflight:
                    forgotten.set()
        assert not done.wait(1.0)  # five deadlines more: a forgotten work never fires
    finally:
        dog.close()
    assert fired == []


def test_a_settled_step_is_forgotten_even_if_its_work_was_never_polled(store):
    fired: list = []
    done = threading.Event()
    dog = _watchdog(store, fired, done, "t3")
    dog.issued(0, 0, EnqueuedWork())
    dog.settled(0)
    try:
        assert not done.wait(1.0)
    finally:
        dog.close()
    assert fired == []
