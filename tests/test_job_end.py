"""A failed job ends on every rank (``sync/evidence/job_end.py``): a failing rank's note in the
store ends its peers after a grace, a store whose host is gone ends them after a deadline of
connection errors, a flaky store or ``REPORT`` never does, and a rank that fails itself leaves
through its own error. Real TCPStores on loopback; the clock is passed in where the rule is
unit-tested, and the watchdog tests wait on observed state, never on elapsed time."""

from __future__ import annotations

import datetime
import threading

import pytest
import torch.distributed as dist

from openclaw_ref.core.triage import FailureTriage, Report
from openclaw_ref.sync.base import WatchdogAction
from openclaw_ref.sync.errors import JobFailed, ReplicaDivergence, SyncTimeout
from openclaw_ref.sync.evidence.job_end import FailureNote, JobEnd, failure_key, knows_key
from openclaw_ref.sync.evidence.watchdog import Watchdog
from tests.helpers import loopback_store

DEADLINE_S = 0.3
LATE = SyncTimeout("rank 0: allreduce of the step's exchange at step 3 still waiting", ranks=[1],
                   step=3)


@pytest.fixture
def store():
    return loopback_store(10)


def _client(store: dist.TCPStore) -> dist.TCPStore:
    """Another rank's connection: a client serves one operation at a time, so a rank blocked
    in a ``wait`` holds its own connection only."""
    return dist.TCPStore("127.0.0.1", store.port, 1, False,
                         timeout=datetime.timedelta(seconds=10))


def test_a_note_says_who_failed_with_what_and_whom_it_blames_and_survives_its_encoding():
    note = FailureNote.of(0, LATE)
    assert (note.rank, note.kind, note.exit_code, note.step, note.ranks) == \
        (0, "SyncTimeout", 4, 3, (1,))
    assert FailureNote.decode(note.encode().encode()) == note
    piped = FailureNote.of(2, ReplicaDivergence("a | b", step=5, ranks=[1, 3]))
    assert FailureNote.decode(piped.encode().encode()) == piped
    assert FailureNote.decode(b"not a note") is None


def test_a_peers_note_ends_this_rank_after_the_grace_naming_the_peer_and_whom_it_blamed(store):
    peer, me = JobEnd(0, "ns", 2.0, 1.0), JobEnd(1, "ns", 2.0, 1.0)
    peer.declare(store, LATE)
    me.saw(me.read(store), now=10.0)
    assert me.verdict(now=10.9) is None
    ended = me.verdict(now=11.0)
    assert isinstance(ended, JobFailed) and ended.rank == 0 and ended.ranks == [1]
    assert ended.exit_code == 4 and ended.step == 3
    assert str(ended).startswith("rank 0 failed with SyncTimeout (blaming ranks [1]): rank 0:")
    assert str(ended).endswith("rank 1 ends too")


def test_a_rank_that_read_a_peer_s_note_knows_that_failure_before_its_grace_ends(store):
    """What a rank SIGTERMed during its grace records (``StopRecord``'s cause): the peer's."""
    peer, me = JobEnd(0, "ns", 2.0, 1.0), JobEnd(1, "ns", 2.0, 1.0)
    assert me.known() is None
    peer.declare(store, LATE)
    me.saw(me.read(store), now=10.0)
    assert me.verdict(now=10.1) is None
    known = me.known()
    assert isinstance(known, JobFailed) and known.rank == 0 and known.ranks == [1]


def test_a_rank_that_declared_its_own_failure_knows_that_one_not_a_later_peers(store):
    """What a rank SIGTERMed while it waits for its peers' word records: its own error."""
    me, peer = JobEnd(0, "ns", 2.0, 1.0), JobEnd(1, "ns", 2.0, 1.0)
    me.declare(store, LATE)
    peer.declare(store, ReplicaDivergence("x", step=1, ranks=[0]))
    me.saw(FailureNote.of(1, ReplicaDivergence("x", step=1, ranks=[0])), now=0.0)
    assert me.known() is LATE


def test_the_first_note_is_kept_and_a_rank_that_failed_itself_is_not_ended_by_another(store):
    first, second = JobEnd(0, "ns", 2.0, 1.0), JobEnd(1, "ns", 2.0, 1.0)
    first.declare(store, LATE)
    second.declare(store, ReplicaDivergence("x", step=1, ranks=[0]))
    assert second.read(store).rank == 0
    second.saw(second.read(store), now=0.0)
    assert second.verdict(now=100.0) is None  # its own error ends it


def test_a_note_in_another_namespace_is_not_this_jobs(store):
    JobEnd(0, "earlier-task", 2.0, 1.0).declare(store, LATE)
    assert JobEnd(1, "this-task", 2.0, 1.0).read(store) is None


def _leave(job: JobEnd, store: dist.Store, exc: BaseException) -> threading.Thread:
    """``job``'s rank declaring ``exc`` and waiting for its peers, as before its process ends."""
    def run() -> None:
        job.declare(store, exc)
        job.await_peers(store)
    leaving = threading.Thread(target=run)
    leaving.start()
    return leaving


def test_a_rank_leaving_on_its_failure_waits_until_its_peer_has_read_the_note(store):
    """The wait ends on the peer's word, not on its bound (60 s here)."""
    failing, peer = JobEnd(0, "ns", 2.0, 1.0, peers=[1], wait_s=60.0), JobEnd(1, "ns", 2.0, 1.0)
    leaving = _leave(failing, _client(store), LATE)
    store.wait([failure_key("ns")], datetime.timedelta(seconds=20))
    assert leaving.is_alive()  # its peer has not said it knows
    assert peer.saw(peer.read(store), now=0.0)
    peer.acknowledge(store)
    leaving.join(timeout=30)
    assert not leaving.is_alive()


def test_a_rank_whose_process_goes_on_declares_without_waiting_for_its_peers(store):
    """A reused pool's rank runs the next task: waiting would start it late on this rank."""
    failing = JobEnd(0, "ns", 2.0, 1.0, peers=[1], wait_s=60.0)
    declaring = threading.Thread(target=failing.declare, args=(store, LATE))
    declaring.start()
    declaring.join(timeout=30)
    assert not declaring.is_alive() and failing.read(store).rank == 0


def test_a_peer_that_never_reads_the_note_costs_the_leaving_rank_its_bound_and_is_named(store):
    failing = JobEnd(0, "ns", 2.0, 1.0, peers=[1, 2], wait_s=0.2)
    failing.declare(store, LATE)
    JobEnd(2, "ns", 2.0, 1.0).acknowledge(store)
    assert failing.await_peers(store) == [1]


def test_ranks_failing_together_do_not_wait_for_each_others_word(store):
    first = JobEnd(0, "ns", 2.0, 1.0, peers=[1], wait_s=60.0)
    second = JobEnd(1, "ns", 2.0, 1.0, peers=[0], wait_s=60.0)
    leaving = _leave(first, _client(store), LATE)
    second.declare(store, ReplicaDivergence("x", step=1, ranks=[0]))
    assert second.await_peers(store) == []  # 0 said it knows when it declared
    leaving.join(timeout=30)
    assert not leaving.is_alive()


def test_a_store_whose_host_is_gone_ends_the_rank_after_a_deadline_of_connection_errors():
    me = JobEnd(1, "ns", 2.0, 1.0)
    gone = dist.DistNetworkError("Broken pipe")
    me.store_failed(gone, now=5.0)
    me.store_failed(gone, now=6.5)
    assert me.verdict(now=6.9) is None
    ended = me.verdict(now=7.0)
    assert isinstance(ended, JobFailed) and ended.rank is None and ended.exit_code == 1
    assert "has not answered for 2.0 s (DistNetworkError: Broken pipe)" in str(ended)


def test_a_slow_store_or_one_that_answers_again_ends_nothing():
    me = JobEnd(1, "ns", 2.0, 1.0)
    me.store_failed(dist.DistNetworkError("Broken pipe"), now=0.0)
    me.store_answered()
    me.store_failed(RuntimeError("Socket Timeout"), now=1.0)
    assert me.verdict(now=100.0) is None


def _watchdog(store, rank: int, ns: str, action=WatchdogAction.RAISE, ended=None) -> Watchdog:
    def report(exc: BaseException) -> None:
        ended.append(exc)
        done.set()

    done = threading.Event()
    dog = Watchdog(store, rank, 2, DEADLINE_S, ns, on_timeout=report, tick_s=0.02,
                   action=action)
    dog.done = done
    return dog


def test_a_peers_watchdog_ends_its_process_once_a_rank_declared_the_job_failed(store):
    ended: list[BaseException] = []
    me = _watchdog(store, 1, "declared", ended=ended)
    failing = _watchdog(store, 0, "declared", ended=[])
    try:
        failing.declare_failed(LATE)
        assert me.done.wait(20)
    finally:
        me.close()
        failing.close()
    [exc] = ended
    assert isinstance(exc, JobFailed) and exc.rank == 0 and exc.ranks == [1]
    assert me.events[-1].kind == "JobFailed"
    assert store.check([knows_key(me.namespace, 1)])  # its word, which the failing rank awaits


def test_a_watchdog_leaving_on_its_failure_returns_once_its_peers_watchdog_has_read_the_note(
        store):
    peer = _watchdog(store, 1, "leaving", ended=[])
    failing = _watchdog(store, 0, "leaving", ended=[])
    failing.job.wait_s = 60.0  # its bound (here 3 ticks) made long: only the word ends the wait
    try:
        failing.declare_failed(LATE, leaving=True)
        assert store.check([knows_key(failing.namespace, 1)])
        assert peer.job.note is not None and peer.job.note.rank == 0
    finally:
        peer.close()
        failing.close()


def test_exit_ends_the_process_only_after_the_peers_watchdog_has_read_the_note(store):
    peer = _watchdog(store, 1, "exiting", ended=[])
    told_before_end: list[bool] = []
    failing = _watchdog(store, 0, "exiting", WatchdogAction.EXIT, ended=told_before_end)
    failing.job.wait_s = 60.0
    failing.on_timeout = lambda exc: (told_before_end.append(
        failing.store.check([knows_key(failing.namespace, 1)])), failing.done.set())
    failing.issued(2, 0, Pending())  # overdue after the deadline: EXIT fires
    try:
        assert failing.done.wait(30)
    finally:
        peer.close()
        failing.close()
    assert told_before_end == [True]


def test_report_records_nothing_more_than_it_did_and_never_ends_the_process(store):
    ended: list[BaseException] = []
    me = _watchdog(store, 1, "report", WatchdogAction.REPORT, ended=ended)
    try:
        JobEnd(0, me.namespace, DEADLINE_S, DEADLINE_S / 2).declare(store, LATE)
        ticks = me._count
        until_ticks = ticks + int(4 * DEADLINE_S / me.tick_s)
        while me._count < until_ticks:  # four deadlines of ticks: observed, not slept
            me._stop.wait(me.tick_s)
    finally:
        me.close()
    assert ended == [] and me.job.note is not None


def test_a_watchdog_whose_store_host_died_ends_its_process_within_the_deadline():
    server = loopback_store(5)
    client = dist.TCPStore("127.0.0.1", server.port, 1, False,
                           timeout=datetime.timedelta(seconds=5))
    ended: list[BaseException] = []
    me = _watchdog(client, 1, "gone", ended=ended)
    try:
        del server  # the store's host ends
        assert me.done.wait(30)
    finally:
        me.close()
    [exc] = ended
    assert isinstance(exc, JobFailed) and "its host" in str(exc) and "rank 1 ends too" in str(exc)


def test_the_launcher_blames_the_failing_peer_not_the_rank_that_ended_because_of_it():
    triage = FailureTriage(range(2))
    echo = JobFailed("rank 0 failed with SyncTimeout (blaming ranks [1]): …", rank=0, ranks=[1],
                     exit_code=4)
    triage.report(Report(1, f"JobFailed: {echo}", "", echo), now=0.0)
    assert triage.decide(now=0.1) is None  # the peer's own report may follow
    triage.report(Report(0, f"SyncTimeout: {LATE}", "", LATE), now=0.2)
    assert triage.decide(now=0.2).rank == 0


class Pending:
    """A collective that never completes (its peer never arrives)."""

    def is_completed(self) -> bool:
        return False


def test_a_timeout_raised_in_the_training_thread_leaves_the_failure_note_for_the_late_rank(
        store):
    me = _watchdog(store, 0, "raised", ended=[])
    me.issued(2, 0, Pending())  # rank 1 never publishes a beat: silent
    try:
        for _ in range(2000):  # until the diagnosis is recorded (observed, polled)
            if me.events:
                break
            me._stop.wait(0.01)
        with pytest.raises(SyncTimeout):
            me.check()
    finally:
        me.close()
    note = JobEnd(1, me.namespace, DEADLINE_S, DEADLINE_S / 2).read(store)
    assert (note.rank, note.kind, note.exit_code, note.ranks) == (0, "SyncTimeout", 4, (1,))
