"""Runs the FSDP2 corpus script under torchrun and reads back one outcome per pattern, also when
a rank died by signal (gloo aborts the process on a collective size mismatch, and torchrun then
ends the other ranks, rank 0 with them, before it can print).

A job is checked in one line before any process starts. torchrun runs with ``--redirects 3``
into a log directory, so each rank's stderr (where gloo's own abort message goes) is attributed
to that rank. The whole job has a deadline; past it torchrun is stopped and ranks that wrote
nothing count as hung.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from openclaw_ref.fsdp_corpus.outcome import classify, read_results, read_step
from openclaw_ref.fsdp_corpus.patterns import CLEAN, Column, Mesh, pattern
from openclaw_ref.sync.errors import BadInput

SCRIPT_MODULE = "openclaw_ref.fsdp_corpus.silent_errors_script"
_FAILURE_ROW = re.compile(r"rank\s*:\s*(\d+)\s*\(local_rank:\s*\d+\)\s*\n\s*exitcode\s*:\s*(-?\d+)"
                          r"[^\n]*?(?:\((SIG\w+)\))?\s*\n")
_GLOO_ABORT = re.compile(r"what\(\):\s*(?:\[[^\]]*\]\s*)?(.*)")


@dataclass(frozen=True)
class Job:
    """One torchrun job: patterns run in order on ``world_size`` ranks. ``timeout_s`` is the
    process group's timeout (how long a hung collective waits); ``deadline_s`` the job's."""

    patterns: tuple[str, ...]
    world_size: int = 2
    mesh: Mesh = Mesh.FSDP
    column: Column = Column.STOCK
    timeout_s: float = 30.0
    deadline_s: float = 240.0
    watchdog_s: float | None = None  # the hardened column's watchdog deadline (None: harden's)

    def __post_init__(self) -> None:
        for name in self.patterns:
            if name != CLEAN:
                pattern(name)
        if self.world_size < 2:
            raise BadInput(f"the corpus needs at least 2 ranks, got {self.world_size}")
        if self.mesh is Mesh.HSDP and self.world_size % 2:
            raise BadInput(f"--mesh hsdp needs an even world size, got {self.world_size}")
        if self.timeout_s <= 0 or self.deadline_s <= 0:
            raise BadInput(f"timeouts must be positive, got {self.timeout_s}, {self.deadline_s}")

    def command(self, out_dir: Path, log_dir: Path) -> list[str]:
        return [sys.executable, "-m", "torch.distributed.run", "--standalone",
                "--nproc-per-node", str(self.world_size), "--log-dir", str(log_dir),
                "--redirects", "3", "-m", SCRIPT_MODULE, "--pattern", ",".join(self.patterns),
                "--column", self.column.value, "--mesh", self.mesh.value,
                "--timeout-s", str(self.timeout_s), "--out-dir", str(out_dir),
                *(("--watchdog-s", str(self.watchdog_s)) if self.watchdog_s else ())]


def rank_log(log_dir: Path, rank: int, stream: str) -> str:
    """Rank ``rank``'s redirected stdout or stderr (one node: local rank = rank)."""
    found = sorted(log_dir.glob(f"*/attempt_*/{rank}/{stream}.log"))
    return found[-1].read_text(errors="replace") if found else ""


def _printed_outcomes(stdout: str) -> dict[str, dict]:
    out = {}
    for line in stdout.splitlines():
        if line.startswith("{") and '"pattern"' in line:
            obj = json.loads(line)
            out[obj["pattern"]] = obj
    return out


def _lost_ranks(torchrun_stderr: str, log_dir: Path) -> tuple[dict[int, str], frozenset[int]]:
    """How each rank torchrun reports as failed left (its signal or exit code, and gloo's abort
    message from that rank's own stderr), and the ranks torchrun itself ended with SIGTERM
    after another rank failed."""
    lost, terminated = {}, set()
    for m in _FAILURE_ROW.finditer(torchrun_stderr):
        rank, code, sig = int(m.group(1)), int(m.group(2)), m.group(3)
        how = f"died by {sig}" if sig else f"exited with code {code}"
        abort = _GLOO_ABORT.search(rank_log(log_dir, rank, "stderr"))
        lost[rank] = f"{how}: {abort.group(1).strip()[:300]}" if abort else how
        if sig == "SIGTERM":
            terminated.add(rank)
    return lost, frozenset(terminated)


def _stop(proc: subprocess.Popen, out_dir: Path) -> str:
    """End a torchrun job past its deadline; its stderr. torchrun starts each rank in a session
    of its own, so it is asked first (SIGTERM: it ends its ranks, then itself), SIGKILL to its
    group after 30 s; then any rank still running (found by the pid file it wrote, confirmed by
    its command line naming this job's directory) is killed."""
    proc.terminate()
    try:
        stderr = proc.communicate(timeout=30)[1]
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stderr = proc.communicate()[1]
    for pid_file in out_dir.glob("rank*.pid"):
        pid = int(pid_file.read_text())
        try:
            if str(out_dir) in Path(f"/proc/{pid}/cmdline").read_text(errors="replace"):
                os.kill(pid, signal.SIGKILL)
        except (OSError, ValueError):
            continue  # already gone
    return stderr


Judge = Callable[..., dict]  # (name, results, *, deadline_hit, lost, lost_steps, terminated)


def run_torchrun(command: list[str], out_dir: Path, deadline_s: float) -> tuple[str, bool]:
    """Run one torchrun job to its end or its deadline: torchrun's stderr, and whether the
    deadline stopped it (then ``_stop`` ended it and every rank it started)."""
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        return proc.communicate(timeout=deadline_s)[1], False
    except subprocess.TimeoutExpired:
        return _stop(proc, out_dir), True


def collect(names: tuple[str, ...], out_dir: Path, log_dir: Path, stderr: str,
            deadline_hit: bool, world_size: int, judge: Judge) -> dict[str, dict]:
    """The outcome of every name the job reached, in order, stopping after the first in which
    a rank failed: rank 0's printed line, or ``judge``'s verdict on what the ranks wrote when
    rank 0 could not print (in the printed lines' form: str keys)."""
    printed = _printed_outcomes(rank_log(log_dir, 0, "stdout"))
    outcomes: dict[str, dict] = {}
    for name in names:
        if name in printed:
            outcomes[name] = printed[name]
            if all(a in ("finished", "detected") for a in printed[name]["per_rank"].values()):
                continue
            break
        results = read_results(out_dir, name, world_size)
        steps = {r: read_step(out_dir, name, r) for r in range(world_size)}
        lost, terminated = _lost_ranks(stderr, log_dir)
        outcomes[name] = json.loads(json.dumps(judge(
            name, results, deadline_hit=deadline_hit, lost=lost, lost_steps=steps,
            terminated=terminated)))
        break
    return outcomes


def run_job(job: Job, workdir: Path | None = None) -> dict[str, dict]:
    """The outcome of every pattern the job reached, by name (the job stops after a pattern in
    which a rank failed): rank 0's printed line, or the classification of what the ranks wrote
    when rank 0 could not print. ``workdir``: where the ranks' files and logs go (kept);
    default a temporary directory."""
    if workdir is None:
        with tempfile.TemporaryDirectory(prefix="openclaw-fsdp-corpus-") as tmp:
            return run_job(job, Path(tmp))
    out_dir, log_dir = workdir / "results", workdir / "logs"
    stderr, deadline_hit = run_torchrun(job.command(out_dir, log_dir), out_dir, job.deadline_s)

    def judge(name: str, results: dict, **how) -> dict:
        return {"column": job.column.value, "world_size": job.world_size,
                "mesh": job.mesh.value, **classify(name, results, None, **how).to_json()}

    return collect(job.patterns, out_dir, log_dir, stderr, deadline_hit, job.world_size, judge)
