"""The cluster mode: ``torchrun … -m openclaw_ref conform`` runs the same checks on the live
group torchrun built (here: --standalone, 2 ranks, gloo), prints one pass/fail table on rank 0
and exits non-zero on any failure."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import openclaw_ref
from openclaw_ref.cli import main

pytestmark = [pytest.mark.conformance, pytest.mark.openclaw_model]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
            "-m", "openclaw_ref", "conform"]


def torchrun(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    package_root = str(Path(openclaw_ref.__file__).parents[1])  # the checkout or site-packages
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": package_root}
    return subprocess.run(TORCHRUN + list(args), capture_output=True, text=True, timeout=timeout,
                          env=env)


def test_hardened_passes_every_check_on_a_torchrun_group(tmp_path):
    out = tmp_path / "conform.json"
    proc = torchrun("--sync", "hardened", "--faults", "permuted-params,nan-grad,bitflip",
                    "--out", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("| check") == 1  # one table: rank 0 alone prints
    report = json.loads(out.read_text())
    names = [c["check"] for c in report["checks"]]
    assert {"shape agreement", "bucket alignment", "overflow rate", "replica consistency",
            "equivalence", "fault detection: bitflip"} <= set(names)
    assert all(c["passed"] for c in report["checks"])


def test_a_failed_check_fails_the_job_with_exit_code_3():
    """Stock DDP detects no bitflip: the fault-detection row fails; every worker exits 3 (the
    verdict is collective) and torchrun reports the job failed (it may stop the second worker
    before that one exits by itself, so only the first is guaranteed in its summary)."""
    proc = torchrun("--sync", "ddp", "--checks", "fault-detection", "--faults", "bitflip")
    assert proc.returncode != 0
    assert "| FAIL" in proc.stdout and "silent-corruption" in proc.stdout
    assert "exitcode  : 3" in proc.stderr, proc.stderr


def test_unknown_check_is_bad_input_before_any_rank_starts(capsys):
    assert main(["conform", "--checks", "no-such-check"]) == 2
    assert "unknown check" in capsys.readouterr().err
