"""A failed job under torchrun ends whole and leaves its record: whichever rank torchrun's agent
ends first, the run JSON is written (``core/stop_record.py``); a rank whose peer failed ends
itself within the watchdog's deadline, saying why (``sync/evidence/job_end.py``); no process is
left behind.

Repetitions run under ``tests/agent_like.py`` — torchrun's environment and its agent's rule
(the first rank to exit non-zero gets its siblings SIGTERMed, here at once) on ranks forked
from one parent, so ten runs cost no interpreter start each. The orphan case runs under two
real torchrun agents joined by c10d rendezvous on loopback.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from openclaw_ref.core.jsonio import read_json
from tests.helpers import ROOT, free_port

AGENT = str(ROOT / "tests" / "agent_like.py")
QUICK = ("--world-size", "2", "--global-batch", "8", "--eval-every", "0", "--no-progress",
         "--sync", "hardened")


def _left_behind(tmp_path: Path) -> list[int]:
    """Processes whose command line names this test's directory (ranks, agents)."""
    left = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if str(tmp_path) in " ".join(p.info["cmdline"] or []):
                left.append(p.pid)
        except psutil.Error:
            continue
    return left


def _repeat(tmp_path: Path, reps: int, *train: str) -> list[dict]:
    result = subprocess.run([sys.executable, AGENT, "--reps", str(reps), "--out-dir",
                             str(tmp_path), "--", "train", *QUICK, *train, "--out", "{out}"],
                            capture_output=True, text=True, timeout=60 + 30 * reps, cwd=ROOT,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    runs = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    assert len(runs) == reps, result.stdout
    return runs


def test_a_fired_check_leaves_its_record_in_ten_runs_of_ten_whichever_rank_is_ended_first(
        tmp_path):
    runs = _repeat(tmp_path, 10, "--steps", "2", "--nonfinite", "raise",
                   "--inject", "nan-grad@1:1")
    for run in runs:
        assert 3 in run["codes"].values(), run  # a rank the agent did not end exits 3
        record = read_json(tmp_path / f"rep{run['rep']}" / "run.json")
        assert record["summary"]["stopped"], run
        assert [(e["kind"], e["step"], e["ranks"]) for e in record["events"]] == \
            [("NonFiniteGradient", 1, [1])], (run, record["events"])
        assert record["config"]["faults"] and record["environment"]
    assert _left_behind(tmp_path) == []


def test_a_rank_ended_by_the_agent_after_its_peer_crashed_writes_the_record_alone(tmp_path):
    """Rank 1 leaves without a word (``os._exit(13)``); the agent SIGTERMs rank 0 at once,
    inside or before the collective its peer's death fails: rank 0's part is written
    either way — from its SIGTERM thread or its own error."""
    runs = _repeat(tmp_path, 3, "--steps", "3", "--inject", "crash@1:1")
    for run in runs:
        assert run["codes"]["1"] == 13 and run["first"] == 1, run
        record = read_json(tmp_path / f"rep{run['rep']}" / "run.json")
        assert record["summary"]["ranks_reporting"] == [0], record["summary"]
        assert record["summary"]["completed_steps"] == {"0": 1}, record["summary"]
    assert _left_behind(tmp_path) == []


def _agent(port: int, node_dir: Path, *train: str) -> subprocess.Popen:
    node_dir.mkdir(parents=True)
    command = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2",
               "--nproc-per-node", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint",
               f"127.0.0.1:{port}", "--local-addr", "127.0.0.1", "-m", "openclaw_ref", "train",
               *QUICK, *train, "--out", str(node_dir / "run.json")]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=ROOT, start_new_session=True,
                            env={**os.environ, "GLOO_SOCKET_IFNAME": "lo",
                                 "PYTHONUNBUFFERED": "1"})


def _on_two_agents(tmp_path: Path, *train: str) -> tuple[dict[str, str], list[str]]:
    """Two torchrun agents (one rank each) run ``train``; each rank's ``stopped_by`` from the
    records and both agents' stderr. Both agents exit 1 (torchrun's code for any failed
    worker) and nothing is left behind."""
    port = free_port()
    agents = [_agent(port, tmp_path / f"node{n}", *train) for n in (0, 1)]
    try:
        errs = [a.communicate(timeout=240)[1] for a in agents]
    finally:
        for a in agents:
            if a.poll() is None:
                os.killpg(a.pid, 9)
    assert [a.returncode for a in agents] == [1, 1], errs
    records = [read_json(tmp_path / f"node{n}" / "run.json") for n in (0, 1)]
    said = {str(r): text for rec in records for r, text in rec["summary"]["stopped_by"].items()}
    assert sorted(said) == ["0", "1"], said
    assert _left_behind(tmp_path) == []
    return said, errs


def test_on_two_torchrun_agents_the_rank_a_timeout_blamed_ends_itself_and_says_why(tmp_path):
    """Rank 1 sleeps 600 s before a backward; rank 0's watchdog ends it at its 2 s deadline
    (SyncTimeout naming rank 1, exit 4). Rank 1, in no collective, reads rank 0's failure note
    and ends itself in one line — before its sleep, and before any outside kill."""
    said, errs = _on_two_agents(tmp_path, "--steps", "3", "--watchdog-s", "2",
                                "--watchdog-action", "exit", "--inject", "hang=600s@1:1")
    assert said["0"].startswith("SyncTimeout: rank 0: allreduce of the step's exchange"), said
    # rank 1 ends on the job's failure, whichever comes first: rank 0's note after its grace
    # (one line), the store gone with rank 0's agent (its host), or its own agent's SIGTERM once
    # rank 0's node is gone — rank 0 exits only once rank 1 has said it read the note, so its
    # record names rank 0's failure in every order. Never an orphan, never "ran until killed".
    assert said["1"].startswith("JobFailed: "), said
    ends = [line for e in errs for line in e.splitlines() if line.startswith("fatal: JobFailed")]
    assert len(ends) <= 1 and all(line.endswith("rank 1 ends too") for line in ends), ends


@pytest.mark.slow
def test_on_two_torchrun_agents_a_timeout_raised_in_the_training_thread_is_named_by_its_peer(
        tmp_path):
    """Under ``raise`` (the default) rank 0's training thread gets control back only at the
    process group's timeout (30 s) and raises the diagnosis; its process ends next, so it
    waits for rank 1's word first (``RankContext.ends_on_failure``): rank 1's record names
    rank 0's failure, whichever ends it. The path end to end; the order the wait enforces is
    the unit tests' (``test_job_end.py``) — here rank 0's own record-writing after its note
    mostly outlasts rank 1's tick even without it (3 of 3 runs)."""
    said, _ = _on_two_agents(tmp_path, "--steps", "3", "--watchdog-s", "2",
                             "--inject", "hang=600s@1:1")
    assert said["0"].startswith("SyncTimeout: rank 0: allreduce of the step's exchange"), said
    assert said["1"].startswith("JobFailed: rank 0 failed with SyncTimeout"), said
