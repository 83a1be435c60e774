"""Every selected test in each arm, one subprocess and one deadline each, into the record.

A test runs as ``python -m torch_ddp_suite.driver TEST ARM OUT`` in a session of its own, with
PyTorch's environment (``BACKEND=gloo``, ``WORLD_SIZE=2``, a fresh ``TEMP_DIR`` holding
``barrier/`` and ``test_dir/``) and one thread per rank; past its deadline the whole session
is killed and the outcome is ``timeout``. The record is rewritten (atomically) after every
test, so an interrupted run resumes where it stopped (``--resume``). The hardened arm of a
test that PyTorch's run skipped or failed stock is still run: its row says what it did.
"""

from __future__ import annotations

import datetime
import enum
import json
import os
import platform
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from openclaw_ref.core.jsonio import write_json_atomic
from torch_ddp_suite.selection import Selected, Status

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = 1


class Arm(enum.StrEnum):
    STOCK = "stock"
    HARDENED = "hardened"


class Outcome(enum.StrEnum):
    PASSED = "passed"
    FAILED = "failed"
    ERROR = "error"
    SKIPPED = "skipped"
    TIMEOUT = "timeout"
    REFUSED = "refused"  # harden() raised BadInput in a rank: the test stopped there
    CRASHED = "crashed"  # the driver itself died without a result


EXCEPTION = re.compile(r"^[\w.]+(Error|Exception|Mismatch|Averaged|Divergence|Gradient|Timeout|"
                       r"Failed)\b")


def exception_line(text: str) -> str:
    """The line of a failed test's text worth a table cell: a rank's ``BadInput`` where one
    was raised (a rank's traceback is quoted inside the parent's failure), else the last line
    that names an exception, else the last line."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    refusal = [ln for ln in lines if "BadInput:" in ln]
    if refusal:
        return refusal[-1]
    named = [ln for ln in lines if EXCEPTION.match(ln)]
    return (named or lines or [""])[-1]


def classify(outcome: str, detail: str) -> Outcome:
    """The driver's outcome, with a failure whose cause is ``harden()``'s ``BadInput``
    told apart as a refusal."""
    if outcome in (Outcome.FAILED, Outcome.ERROR) and "BadInput:" in detail:
        return Outcome.REFUSED
    return Outcome(outcome)


def run_one(test: str, arm: Arm, deadline_s: float) -> dict:
    """One test in one arm: its outcome, detail and seconds, and how many DDPs its ranks
    handed to ``harden()`` (0 in the stock arm)."""
    with tempfile.TemporaryDirectory(prefix="torch-ddp-suite-") as tmp:
        for sub in ("barrier", "test_dir"):
            os.mkdir(os.path.join(tmp, sub))
        out = os.path.join(tmp, "result.json")
        witness = os.path.join(tmp, "hardened.txt")
        env = dict(os.environ, BACKEND="gloo", WORLD_SIZE="2", TEMP_DIR=tmp,
                   OMP_NUM_THREADS="1", TORCH_DDP_SUITE_ARM=arm.value,
                   TORCH_DDP_SUITE_WITNESS=witness, PYTHONUNBUFFERED="1")
        cmd = [sys.executable, "-m", "torch_ddp_suite.driver", test, arm.value, out]
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, start_new_session=True)
        try:
            log, _ = proc.communicate(timeout=deadline_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the driver's session: it and its ranks
            proc.communicate()
            return {"outcome": Outcome.TIMEOUT.value, "seconds": time.perf_counter() - t0,
                    "detail": f"past the {deadline_s:.0f} s deadline"}
        seconds = time.perf_counter() - t0
        if not os.path.exists(out):
            tail = log.decode(errors="replace").strip().splitlines()[-1:] or [""]
            return {"outcome": Outcome.CRASHED.value, "seconds": seconds,
                    "detail": f"exit {proc.returncode}: {tail[0]}"}
        with open(out, encoding="utf-8") as f:
            got = json.load(f)
        hardened = 0
        if os.path.exists(witness):
            with open(witness, encoding="utf-8") as f:
                hardened = len(f.read().split())
    return {"outcome": classify(got["outcome"], got["detail"]).value, "seconds": seconds,
            "detail": got["detail"], "ddps_hardened": hardened}


def git_commit() -> str:
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True,
                             text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "openclaw_ref"],
                               cwd=ROOT, capture_output=True, text=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return sha + ("+uncommitted openclaw_ref changes" if dirty else "")


def new_record(selected: list[Selected], deadline_s: float) -> dict:
    return {
        "schema": SCHEMA,
        "torch": torch.__version__, "python": platform.python_version(),
        "host": f"{platform.machine()}, {os.cpu_count()} cores",
        "started": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "git": {}, "deadline_s": deadline_s, "world_size": 2, "backend": "gloo",
        "tests": {s.name: {"status": s.status.value, "why": s.why, "arms": {}}
                  for s in selected},
    }


def run_all(record: dict, arms: list[Arm], path: Path, deadline_s: float,
            only: set[str] | None = None, log=print) -> dict:
    """Run every runnable test of ``record`` not yet run in each of ``arms`` (all of them in
    ``only`` again), rewriting ``path`` after each; the commit each arm ran at, by arm."""
    for arm in arms:
        record["git"][arm.value] = git_commit()
    for name, entry in record["tests"].items():
        if entry["status"] != Status.RUNNABLE.value:
            continue
        for arm in arms:
            wanted = name in only if only is not None else arm.value not in entry["arms"]
            if not wanted:
                continue
            result = run_one(name, arm, deadline_s)
            entry["arms"][arm.value] = result
            log(f"{name} [{arm.value}]: {result['outcome']} in {result['seconds']:.1f} s"
                + (f" — {result['detail']}" if result["detail"] else ""))
            record["finished"] = datetime.datetime.now(datetime.UTC).isoformat(
                timespec="seconds")
            write_json_atomic(path, record, float_digits=4)
    return record
