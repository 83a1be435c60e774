"""The scripts in ``examples/`` run as their readers are told to run them: each under torchrun
with 2 CPU ranks, the FSDP2 × TP one with 4 (dp=2 × tp=2), gloo on loopback, torchrun's
``--standalone`` rendezvous on a free port, the command taken verbatim from where it is
written — the README for ``ddp_train.py``, each script's docstring for all of them — with a
deadline, leaving no process behind."""

from __future__ import annotations

import ast
import os
import re
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from tests.helpers import ROOT

EXAMPLES = ROOT / "examples"
DEADLINE_S = 300  # torchrun's start-up is ~10 s here; inductor's first compile ~30 s per rank
TORCHRUN = re.compile(r"torchrun --standalone --nproc-per-node \d+ examples/\w+\.py")


def _documented(text: str, script: str) -> str:
    """The one torchrun command for ``script`` written in ``text``."""
    found = {m.group(0) for m in TORCHRUN.finditer(text) if m.group(0).endswith(f"/{script}")}
    assert len(found) == 1, f"expected one torchrun command for {script}, found {found}"
    return found.pop()


def _run(command: str) -> subprocess.CompletedProcess:
    """``command`` as a shell would split it, from the repository root, with this Python's
    ``torchrun`` first on PATH; its process group killed at the deadline."""
    env = {**os.environ, "PATH": os.pathsep.join([str(Path(sys.executable).parent),
                                                  os.environ.get("PATH", "")]),
           "PYTHONUNBUFFERED": "1", "GLOO_SOCKET_IFNAME": "lo"}
    proc = subprocess.Popen(shlex.split(command), cwd=ROOT, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=DEADLINE_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"{command} ran past {DEADLINE_S} s:\n{err[-3000:]}")
    assert not _left_behind(proc.pid)
    return subprocess.CompletedProcess(command, proc.returncode, out, err)


def _left_behind(pid: int) -> list[int]:
    """Processes still in the command's session (torchrun's workers)."""
    left = []
    for p in psutil.process_iter(["pid"]):
        try:
            if os.getsid(p.info["pid"]) == pid:
                left.append(p.info["pid"])
        except (ProcessLookupError, PermissionError, psutil.Error):
            continue
    return left


def _trains(result: subprocess.CompletedProcess) -> int:
    """The number of checks that passed, from rank 0's one summary line."""
    assert result.returncode == 0, result.stderr[-3000:]
    lines = re.findall(r"^loss [\d.]+, (\d+) checks passed$", result.stdout, re.MULTILINE)
    assert len(lines) == 1, result.stdout  # rank 0 alone prints
    return int(lines[0])


def test_the_readmes_command_runs_the_ddp_example():
    checks = _trains(_run(_documented((ROOT / "README.md").read_text(), "ddp_train.py")))
    assert checks == 21  # the start-up check and one per step


@pytest.mark.parametrize("script", ["ddp_train.py", "fsdp2_train.py", "compiled_train.py",
                                    "fsdp2_tp_train.py"])
def test_each_example_runs_as_its_docstring_says(script):
    doc = ast.get_docstring(ast.parse((EXAMPLES / script).read_text()))
    assert doc and "torch.distributed" not in doc.split("\n")[0]
    if script == "ddp_train.py":  # the README's command, run above, is this same string
        assert _documented(doc, script) == _documented((ROOT / "README.md").read_text(), script)
        return
    assert _trains(_run(_documented(doc, script))) >= 20  # one exchange per step at least
