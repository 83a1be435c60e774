"""How ranks start (``core/rank_start``): forked from one server that imported torch, yet each
rank gets what a spawned one would — the parent's environment and streams as of the rank's
start — and none outlives the parent."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

from openclaw_ref.core.launch import LaunchConfig, RankPool
from tests.helpers import ROOT

SCRIPT = ROOT / "tests" / "rank_start_script.py"


def variable_and_parent(ctx, name: str) -> tuple[str | None, int]:
    return os.environ.get(name), os.getppid()


def parent_pid(ctx) -> int:
    return os.getppid()


def test_a_rank_sees_the_parents_environment_as_of_its_start_not_the_servers(monkeypatch):
    monkeypatch.setenv("OPENCLAW_RANK_START_PROBE", "before")
    with RankPool(LaunchConfig(1, backend="gloo")) as first:
        (seen_first, server), = first.run(variable_and_parent, "OPENCLAW_RANK_START_PROBE")
    monkeypatch.setenv("OPENCLAW_RANK_START_PROBE", "after")
    with RankPool(LaunchConfig(1, backend="gloo")) as second:
        (seen_second, server_again), = second.run(variable_and_parent, "OPENCLAW_RANK_START_PROBE")
    monkeypatch.delenv("OPENCLAW_RANK_START_PROBE")
    with RankPool(LaunchConfig(1, backend="gloo")) as third:
        (seen_third, _), = third.run(variable_and_parent, "OPENCLAW_RANK_START_PROBE")
    assert (seen_first, seen_second, seen_third) == ("before", "after", None)
    assert server == server_again != os.getpid(), "both pools forked from one server"


def test_the_server_the_ranks_fork_from_has_torch_loaded_before_any_rank_exists(pools):
    """Read from the server's own memory map: a rank's ``sys.modules`` cannot tell, since
    unpickling its task imports torch anyway."""
    servers = set(pools.get(2).run(parent_pid))
    assert len(servers) == 1 and os.getpid() not in servers
    maps = Path(f"/proc/{servers.pop()}/maps").read_text()
    assert "libtorch_cpu" in maps


def test_a_ranks_output_goes_where_the_parents_went_when_the_rank_started(tmp_path):
    first, second = tmp_path / "a.txt", tmp_path / "b.txt"
    done = subprocess.run([sys.executable, str(SCRIPT), "streams", str(first), str(second)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "started from rank 0" in first.read_text()
    assert "hello from rank 0" in second.read_text()
    assert "hello" not in first.read_text()


def test_no_rank_and_no_server_outlive_a_parent_killed_by_sigkill():
    parent = subprocess.Popen([sys.executable, str(SCRIPT), "orphan"], cwd=ROOT,
                              stdout=subprocess.PIPE, text=True)
    try:
        pids = [int(p) for p in parent.stdout.readline().split()]
    finally:
        parent.send_signal(signal.SIGKILL)
        parent.wait(30)
    assert len(pids) == 3, pids  # two ranks and their server
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.1)
    assert not [p for p in pids if _alive(p)]


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
