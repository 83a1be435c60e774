"""How ``openclaw-bench train`` ends when a check fires or a run hangs: exit 3 or 4, one first
line naming the check and the rank(s) the error blames (not the rank whose report arrived
first), tracebacks and stack dumps only with ``--verbose``; under torchrun the line once. And a
hardened run whose replicas differ when it ends exits 3, whatever slice the rotation was on."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from openclaw_ref.cli.failure import details, failure_line, report_failure
from openclaw_ref.core.errors import LaunchTimeout, RankFailed
from openclaw_ref.sync.errors import NonFiniteGradient
from tests.helpers import run_cli

QUICK = ("--world-size", "2", "--global-batch", "8", "--eval-every", "0", "--no-progress")
NAN_ON_RANK_1 = NonFiniteGradient("local gradients held NaN/inf before the wire", step=2,
                                  ranks=[1])


def _reported_by_rank_0() -> RankFailed:
    """What the launcher raises when rank 0's copy of rank 1's NaN error arrived first."""
    return RankFailed(0, f"NonFiniteGradient: {NAN_ON_RANK_1}", "Traceback (most recent...)\n",
                      NAN_ON_RANK_1)


def test_the_failure_line_names_the_rank_the_check_blames_not_the_reporter():
    line = failure_line(_reported_by_rank_0())
    assert line == ("openclaw-bench: NonFiniteGradient at step 2, ranks [1]: local gradients "
                    "held NaN/inf before the wire")


def test_a_rank_that_raised_something_else_is_named_as_the_failed_rank():
    line = failure_line(RankFailed(1, "ValueError: boom", "Traceback...\n", ValueError("boom")))
    assert line == "openclaw-bench: rank 1 failed: ValueError: boom"


def test_the_traceback_follows_only_with_verbose():
    exc = _reported_by_rank_0()
    assert details(exc, verbose=False) == ""
    assert details(exc, verbose=True).startswith("Traceback (most recent")


def test_past_the_deadline_the_stacks_folder_is_named_and_verbose_prints_each_rank_whole(
        tmp_path: Path):
    for rank in (0, 1):
        (tmp_path / f"rank{rank}.txt").write_text(f'  File "x.py", line {rank} in wait\n')
    exc = LaunchTimeout("train_rank did not finish within 20 s", ranks=[0, 1],
                        stacks_dir=str(tmp_path))
    assert details(exc, verbose=False) == (
        f"openclaw-bench: stacks of the unfinished ranks: {tmp_path}\n")
    assert details(exc, verbose=True) == ('--- rank0 stacks ---\n  File "x.py", line 0 in wait\n'
                                          '--- rank1 stacks ---\n  File "x.py", line 1 in wait\n')


def test_under_torchrun_without_a_store_only_rank_0_prints(monkeypatch, capsys):
    monkeypatch.setenv("WORLD_SIZE", "2")
    printed = {}
    for rank in ("0", "1"):
        monkeypatch.setenv("RANK", rank)
        assert report_failure(_reported_by_rank_0(), verbose=False) == 3
        printed[rank] = capsys.readouterr().err
    assert printed["0"].startswith("openclaw-bench: NonFiniteGradient") and printed["1"] == ""


def test_a_fired_check_prints_one_line_blaming_the_faulty_rank_and_no_traceback():
    result = run_cli("train", *QUICK, "--steps", "3", "--sync", "hardened", "--nonfinite",
                     "raise", "--inject", "nan-grad@1:2")
    assert result.returncode == 3
    first, *rest = result.stderr.strip().splitlines()
    assert first.startswith("openclaw-bench: NonFiniteGradient at step 2, ranks [1]:"), first
    assert "Traceback" not in result.stderr and not rest


def test_replicas_that_differ_after_their_slices_last_visit_exit_3_naming_rank_and_parameter():
    # bitflip after step 2's optimizer step, in slice 14 of 16: steps 3-5 digest slices 3-5
    result = run_cli("train", *QUICK, "--steps", "6", "--sync", "hardened",
                     "--inject", "bitflip@1:2")
    assert result.returncode == 3, result.stderr[-2000:]
    first = result.stderr.strip().splitlines()[0]
    assert first.startswith("openclaw-bench: ReplicaDivergence at step 5, ranks [0, 1]:"), first
    assert "at close()" in first and "layer.5.ffn.w1.weight" in first


@pytest.mark.slow  # torchrun's own start-up: 13-14 s on the loaded 2-core machine
def test_under_torchrun_the_failure_line_is_printed_once():
    torchrun = (sys.executable, "-m", "torch.distributed.run", "--standalone",
                "--nproc-per-node", "2", "-m", "openclaw_ref")
    result = run_cli("train", *QUICK, "--steps", "3", "--sync", "hardened", "--nonfinite",
                     "raise", "--inject", "nan-grad@1:2", launcher=torchrun)
    assert result.returncode != 0
    assert result.stderr.count("openclaw-bench: NonFiniteGradient at step 2, ranks [1]") == 1
