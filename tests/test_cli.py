"""``openclaw-bench``: bad input fails fast with exit 2; a real run prints its summary."""

from __future__ import annotations

import json
import multiprocessing
import sys

import pytest

from openclaw_ref.cli import main
from tests.helpers import run_cli


@pytest.mark.parametrize("args,message", [
    (["--world-size", "0"], "world size"),
    (["--preset", "huge"], "invalid choice"),
    (["--steps", "0"], "steps"),
    (["--sparsity", "0.7,0.2"], "empty"),
    (["--sparsity", "0.1,1.2"], "[0, 1)"),
    (["--world-size", "4", "--global-batch", "30"], "multiple"),
    (["--sync", "nope"], "invalid choice"),
    (["--scale", "1000", "--sync", "ddp"], "power of two"),
])
def test_bad_arguments_exit_2_with_one_line_before_spawning(args, message, capsys):
    children_before = set(multiprocessing.active_children())
    try:
        code = main(["train", "--no-progress", *args])
    except SystemExit as exc:  # argparse's own rejections
        code = exc.code
    captured = capsys.readouterr()
    assert code == 2
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and message in lines[0]
    assert captured.out == ""
    assert set(multiprocessing.active_children()) == children_before


def test_train_prints_a_summary_table_and_writes_the_run_json(tmp_path):
    out = tmp_path / "run.json"
    result = run_cli("train", "--world-size", "2", "--steps", "4", "--global-batch", "8",
                     "--no-progress", "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert "| sync" in result.stdout and "replicas equal" in result.stdout
    record = json.loads(out.read_text())
    assert len(record["steps"]) == 4 and record["summary"]["replicas_equal"]


def test_train_runs_unchanged_under_torchrun(tmp_path):
    out = tmp_path / "run.json"
    torchrun = (sys.executable, "-m", "torch.distributed.run", "--standalone",
                "--nproc-per-node", "2", "-m", "openclaw_ref")
    result = run_cli("train", "--world-size", "2", "--steps", "3", "--global-batch", "8",
                     "--no-progress", "--out", str(out), launcher=torchrun)
    assert result.returncode == 0, result.stderr[-3000:]
    record = json.loads(out.read_text())
    assert record["environment"]["world_size"] == 2
    assert result.stdout.count("| sync") == 1  # rank 0 alone prints
