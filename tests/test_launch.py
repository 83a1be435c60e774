"""The launcher: rendezvous on loopback, errors and hangs surface with ranks named, no orphans."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import psutil
import pytest
import torch
import torch.distributed as dist

from openclaw_ref.core.errors import LaunchTimeout, RankFailed
from openclaw_ref.core.launch import LaunchConfig, RankPool, launch
from openclaw_ref.sync.base import WatchdogAction
from openclaw_ref.sync.errors import BadInput
from openclaw_ref.sync.evidence.watchdog import Watchdog


def sum_of_ranks(ctx) -> float:
    t = torch.tensor([float(ctx.rank)])
    dist.all_reduce(t)
    return float(t)


def raise_on_rank_one(ctx) -> None:
    if ctx.rank == 1:
        raise ValueError("boom on purpose")
    dist.barrier()  # the siblings wait here until the parent kills them


def hang_on_last_rank(ctx) -> None:
    if ctx.rank == ctx.world_size - 1:
        time.sleep(3600)
    dist.barrier()


def watched_hang_on_last_rank(ctx) -> None:
    """As ``hang_on_last_rank``, each rank with a watchdog (its deadline 0.5 s, reporting
    only) that watches the barrier."""
    dog = Watchdog(ctx.store, ctx.rank, ctx.world_size, 0.5, "launch-late",
                   action=WatchdogAction.REPORT)
    if ctx.rank == ctx.world_size - 1:
        time.sleep(3600)
    work = dist.barrier(async_op=True)
    dog.issued(0, 0, work)
    work.wait()


def abort_on_rank_zero(ctx) -> None:
    if ctx.rank == 0:
        os.abort()  # what gloo does on a size mismatch
    dist.barrier()


def store_endpoint(ctx) -> tuple[str, int]:
    return os.environ.get("GLOO_SOCKET_IFNAME", ""), torch.get_num_threads()


def _all_dead(pids: list[int], within_s: float = 10.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE
                   for p in pids):
            return True
        time.sleep(0.1)
    return False


def test_a_pool_runs_many_tasks_on_one_process_group(pools):
    pool = pools.get(2)
    assert pool.run(sum_of_ranks) == [1.0, 1.0]
    assert pool.run(sum_of_ranks) == [1.0, 1.0]


def test_ranks_use_one_thread_each_and_pair_on_loopback(pools):
    assert pools.get(2).run(store_endpoint) == [("lo", 1), ("lo", 1)]


def test_the_rendezvous_store_listens_on_loopback_only(pools):
    pool = pools.get(2)
    listening = [c for c in psutil.net_connections("tcp")
                 if c.status == psutil.CONN_LISTEN and c.pid == os.getpid()]
    assert listening, "the parent hosts the rendezvous store"
    assert all(c.laddr.ip == "127.0.0.1" for c in listening), [(c.laddr, c.fd) for c in listening]
    assert pool.run(sum_of_ranks) == [1.0, 1.0]


def test_a_raising_rank_is_named_with_its_traceback_and_siblings_stop():
    pool = RankPool(LaunchConfig(3, backend="gloo", timeout_s=60))
    pids = pool.pids
    started = time.monotonic()
    with pytest.raises(RankFailed) as info:
        pool.run(raise_on_rank_one)
    assert info.value.rank == 1
    assert "boom on purpose" in info.value.traceback_text
    assert isinstance(info.value.cause, ValueError)
    assert time.monotonic() - started < 30  # stopped at once, not at the collective timeout
    assert _all_dead(pids)


def test_a_hung_rank_ends_in_a_timeout_naming_unfinished_ranks():
    pool = RankPool(LaunchConfig(2, backend="gloo", timeout_s=3))
    pids = pool.pids
    with pytest.raises(LaunchTimeout) as info:
        pool.run(hang_on_last_rank)
    assert info.value.ranks == [0, 1]  # both: rank 0 waits in the barrier for rank 1
    assert info.value.exit_code == 4
    assert _all_dead(pids)


def test_past_the_deadline_the_late_rank_a_watchdog_named_is_the_one_named():
    pool = RankPool(LaunchConfig(2, backend="gloo", timeout_s=4))
    pids = pool.pids
    with pytest.raises(LaunchTimeout) as info:
        pool.run(watched_hang_on_last_rank)
    assert info.value.ranks == [1], info.value  # rank 0 waits on it, and its watchdog says so
    assert "rank 0's watchdog names the late ranks (of the unfinished [0, 1])" in str(info.value)
    assert _all_dead(pids)


def test_past_the_deadline_each_unfinished_rank_writes_its_stacks_to_its_own_file():
    pool = RankPool(LaunchConfig(2, backend="gloo", timeout_s=3))
    with pytest.raises(LaunchTimeout) as info:
        pool.run(hang_on_last_rank)
    stacks = Path(info.value.stacks_dir)
    assert sorted(p.name for p in stacks.glob("rank*.txt")) == ["rank0.txt", "rank1.txt"]
    assert "hang_on_last_rank" in (stacks / "rank1.txt").read_text()  # its own stack, whole
    shutil.rmtree(stacks)


def test_a_rank_killed_by_a_signal_is_named():
    with pytest.raises(RankFailed, match="SIGABRT") as info:
        launch(abort_on_rank_zero, LaunchConfig(2, backend="gloo", timeout_s=60))
    assert info.value.rank == 0


def test_a_broken_pool_refuses_further_tasks():
    pool = RankPool(LaunchConfig(2, backend="gloo", timeout_s=60))
    with pytest.raises(RankFailed):
        pool.run(raise_on_rank_one)
    with pytest.raises(RuntimeError, match="make a new one"):
        pool.run(sum_of_ranks)


@pytest.mark.parametrize("kwargs", [{"world_size": 0}, {"world_size": 2, "backend": "mpi"},
                                    {"world_size": 2, "timeout_s": 0}])
def test_bad_launch_config_is_rejected_before_spawning(kwargs):
    with pytest.raises(BadInput):
        LaunchConfig(**kwargs)


def test_nccl_without_gpus_is_rejected_before_spawning():
    if torch.cuda.is_available():
        pytest.skip("this machine has GPUs")
    with pytest.raises(BadInput, match="GPUs"):
        RankPool(LaunchConfig(2, backend="nccl"))


# --- who is blamed: FailureTriage fed every order of arrival, no processes, no sleeps ----------

from openclaw_ref.core.triage import CHECK_GRACE_S, ECHO_GRACE_S, FailureTriage, Report  # noqa: E402
from openclaw_ref.sync.errors import ClockMismatch  # noqa: E402

SIGABRT_EXIT = -6
ECHO = Report(1, "RuntimeError: Connection closed by peer [127.0.0.1]:4242",
              cause=RuntimeError("Connection closed by peer"))


def test_a_signal_death_seen_before_the_siblings_transport_error_is_blamed():
    triage = FailureTriage(range(2))
    triage.exited(0, SIGABRT_EXIT)
    assert triage.decide(now=0.0).rank == 0
    triage.report(ECHO, now=0.1)
    blame = triage.decide(now=0.1)
    assert blame.rank == 0 and "SIGABRT" in blame.summary


def test_a_signal_death_seen_after_the_siblings_transport_error_is_blamed():
    triage = FailureTriage(range(2))
    triage.report(ECHO, now=0.0)
    assert triage.decide(now=0.0) is None  # the echo waits for its cause
    triage.exited(0, SIGABRT_EXIT)
    blame = triage.decide(now=0.5)
    assert blame.rank == 0
    assert "SIGABRT" in blame.summary and "then rank 1 reported" in blame.summary


def test_a_reporting_rank_that_then_exits_is_not_a_silent_death():
    triage = FailureTriage(range(2))
    triage.report(ECHO, now=0.0)
    triage.exited(1, 1)
    assert triage.decide(now=0.1) is None  # rank 0 is still unaccounted for, inside the grace
    blame = triage.decide(now=ECHO_GRACE_S + 0.1)
    assert blame.rank == 1 and blame.summary == ECHO.summary


def test_a_plain_exception_is_blamed_once_every_sibling_reported():
    triage = FailureTriage(range(3))
    boom = Report(2, "ValueError: boom", cause=ValueError("boom"))
    triage.report(boom, now=0.0)
    triage.report(Report(0, "RuntimeError: closed", cause=RuntimeError()), now=0.1)
    assert triage.decide(now=0.1) is None
    triage.report(Report(1, "RuntimeError: closed", cause=RuntimeError()), now=0.2)
    assert triage.decide(now=0.2).rank == 2  # settled long before the grace ends


def test_a_fired_check_waits_for_the_siblings_last_words_then_names_the_first_reporter():
    check = ClockMismatch("clocks differ", step=3, ranks=[1])
    triage = FailureTriage(range(2))
    triage.report(Report(0, str(check), cause=check), now=0.0)
    assert triage.decide(now=1.0) is None
    assert triage.wake_at() == CHECK_GRACE_S
    triage.report(Report(1, str(check), cause=check), now=1.0)
    assert triage.decide(now=1.0).rank == 0


def test_an_error_that_names_its_cause_is_blamed_at_once():
    timeout = LaunchTimeout("stuck", ranks=[1])
    triage = FailureTriage(range(2))
    triage.report(Report(0, str(timeout), cause=timeout), now=0.0)
    assert triage.decide(now=0.0).rank == 0


def test_among_silent_deaths_a_signal_beats_an_exit_code():
    triage = FailureTriage(range(3))
    triage.exited(0, 1)
    triage.exited(2, SIGABRT_EXIT)
    assert triage.decide(now=0.0).rank == 2


def test_a_finished_rank_that_exits_is_not_blamed():
    triage = FailureTriage(range(2))
    triage.finish(0)
    triage.exited(0, 0)
    assert triage.decide(now=10.0) is None
