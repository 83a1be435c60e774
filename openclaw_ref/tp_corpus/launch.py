"""Runs the TP corpus script under torchrun (``fsdp_corpus.launch``'s runner: its deadline,
each rank's logs, how a rank that died by signal left) and reads back one outcome per case.

A job is checked in one line before any process starts: known cases, all on one mesh (the
mesh fixes the world size), positive timeouts.
"""

from __future__ import annotations

import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from openclaw_ref.fsdp_corpus.launch import collect, run_torchrun
from openclaw_ref.fsdp_corpus.patterns import Column
from openclaw_ref.sync.errors import BadInput
from openclaw_ref.tp_corpus.cases import MeshShape
from openclaw_ref.tp_corpus.outcome import judge
from openclaw_ref.tp_corpus.script import mesh_of

SCRIPT_MODULE = "openclaw_ref.tp_corpus.script"


@dataclass(frozen=True)
class Job:
    """One torchrun job: cases run in order under one column. ``timeout_s`` is the process
    group's timeout (how long a hung collective waits); ``deadline_s`` the job's."""

    cases: tuple[str, ...]
    column: Column = Column.STOCK
    timeout_s: float = 30.0
    deadline_s: float = 600.0

    def __post_init__(self) -> None:
        mesh_of(self.cases)
        if self.timeout_s <= 0 or self.deadline_s <= 0:
            raise BadInput(f"timeouts must be positive, got {self.timeout_s}, {self.deadline_s}")

    @property
    def mesh(self) -> MeshShape:
        return mesh_of(self.cases)

    def command(self, out_dir: Path, log_dir: Path) -> list[str]:
        return [sys.executable, "-m", "torch.distributed.run", "--standalone",
                "--nproc-per-node", str(self.mesh.world_size), "--log-dir", str(log_dir),
                "--redirects", "3", "-m", SCRIPT_MODULE, "--case", ",".join(self.cases),
                "--column", self.column.value, "--timeout-s", str(self.timeout_s),
                "--out-dir", str(out_dir)]


def run_job(job: Job, workdir: Path | None = None) -> dict[str, dict]:
    """The outcome of every case the job reached, by name (the job stops after a case in which
    a rank failed): rank 0's printed line, or the judgement of what the ranks wrote when rank 0
    could not print. ``workdir``: where the ranks' files and logs go (kept); default a
    temporary directory."""
    if workdir is None:
        with tempfile.TemporaryDirectory(prefix="openclaw-tp-corpus-") as tmp:
            return run_job(job, Path(tmp))
    out_dir, log_dir = workdir / "results", workdir / "logs"
    stderr, deadline_hit = run_torchrun(job.command(out_dir, log_dir), out_dir, job.deadline_s)
    world, mesh = job.mesh.world_size, job.mesh.value

    def judged(name: str, results: dict, **how) -> dict:
        return {"column": job.column.value, "world_size": world, "mesh": mesh,
                **judge(name, results, None, out_dir, **how)}

    return collect(job.cases, out_dir, log_dir, stderr, deadline_hit, world, judged)
