"""``openclaw-bench``: bad input fails fast with exit 2; a real run prints its summary."""

from __future__ import annotations

import argparse
import fcntl
import json
import multiprocessing
import os
import pty
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest

from openclaw_ref.cli import build_parser, choices, main, package_version
from tests.helpers import ROOT, run_cli


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


def _rejected(argv: list[str], capsys, entry=main) -> str:
    """Run ``entry(argv)``; assert exit 2 within a second, one line on stderr and no rank
    spawned; return that line."""
    children_before = set(multiprocessing.active_children())
    started = time.monotonic()
    try:
        code = entry(argv)
    except SystemExit as exc:  # argparse's own rejections
        code = exc.code
    elapsed = time.monotonic() - started
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert code == 2 and len(lines) == 1, captured.err
    assert set(multiprocessing.active_children()) == children_before
    assert elapsed < 1.0  # a rank takes seconds to spawn
    return lines[0]


@pytest.fixture
def a_file(tmp_path) -> Path:
    path = tmp_path / "a-file"
    path.write_text("x")
    return path


@pytest.mark.parametrize("command", [
    ["train", "--no-progress"], ["conform"], ["hook-cost"]])
def test_an_output_file_under_a_file_or_onto_a_directory_is_rejected_before_spawning(
        command, a_file, tmp_path, capsys):
    line = _rejected([*command, "--out", str(a_file / "run.json")], capsys)
    assert "--out" in line and "is not a directory" in line
    line = _rejected([*command, "--out", str(tmp_path)], capsys)
    assert "--out" in line and "is a directory" in line


@pytest.mark.parametrize("args,message", [
    (["--world-size", "1"], "need --world-size >= 2"),
    (["--steps", "2"], "need --steps > 2"),
    (["--repeats", "0"], "need --repeats >= 1"),
    (["--threshold-ms", "0"], "--threshold-ms must be positive"),
    (["--jitter-ms", "5,1"], "0 <= LOW <= HIGH"),
    (["--jitter-ms=-1,2"], "0 <= LOW <= HIGH"),
    (["--jitter-ms", "1,2,3"], "must be LOW,HIGH"),
    (["--jitter-ms", "a,b"], "must be LOW,HIGH"),
])
def test_p2_rejects_bad_input_in_one_line_before_any_rank(args, message, capsys):
    assert message in _rejected(["p2", *args], capsys)


@pytest.mark.parametrize("args,message", [
    (["--out-root", "FILE"], "is not a directory"),
    (["--out-root", "FILE", "--tag", "t"], "is not a directory"),
    (["--out-root", "/sys/openclaw-results"], "cannot write"),
    (["--preset", "huge"], "huge"),
    (["--sections", "nope"], "unknown sections"),
    (["--p2-repeats", "0"], "P2 repeats >= 1"),
])
def test_compare_rejects_bad_input_in_one_line_before_any_rank(args, message, a_file, capsys):
    args = [str(a_file) if a == "FILE" else a for a in args]
    assert message in _rejected(["compare", "--world-sizes", "1,2", *args], capsys)


@pytest.mark.parametrize("out_root", ["results", "results/scratch", "CHECKOUT",
                                      "CHECKOUT/cpu2-gloo"])
def test_a_quick_compare_refuses_to_write_under_results_before_any_rank(out_root, tmp_path,
                                                                       monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # "results" is the working directory's; CHECKOUT the repo's
    out_root = out_root.replace("CHECKOUT", str(ROOT / "results"))
    line = _rejected(["compare", "--quick", "--out-root", out_root], capsys)
    assert "--quick never writes under results/" in line


def test_a_quick_compare_resumes_only_a_run_it_can_find(capsys):
    assert "needs the --out-root" in _rejected(["compare", "--quick", "--resume"], capsys)


def test_compares_help_states_the_full_and_the_quick_defaults_of_the_code():
    from openclaw_ref.cli.results import SIZING
    from openclaw_ref.experiments.settings import QUICK_SETTINGS, CompareConfig

    full = CompareConfig()
    for dest, _, _, full_default, quick_default in SIZING:
        assert str(getattr(full, dest)) == full_default, dest
        assert str(QUICK_SETTINGS[dest]) == quick_default, dest


def test_compare_config_rejects_an_unknown_preset_for_library_callers_too(tmp_path):
    from openclaw_ref.experiments.settings import CompareConfig
    from openclaw_ref.sync.errors import BadInput

    with pytest.raises(BadInput, match="unknown preset 'huge'"):
        CompareConfig(world_sizes=(1,), preset="huge", out_root=str(tmp_path)).validate()


def test_report_rejects_a_results_directory_it_cannot_write(tmp_path, capsys, monkeypatch):
    from openclaw_ref.core import jsonio

    (tmp_path / "raw.json").write_text("{}")
    monkeypatch.setattr(jsonio.tempfile, "mkstemp", _refuse)
    assert "cannot write" in _rejected(["report", str(tmp_path)], capsys)


def _refuse(*args, **kw):
    raise PermissionError(13, "Permission denied")


@pytest.mark.parametrize("flag", ["--out", "--markdown"])
def test_the_benchmark_matrix_checks_its_outputs_before_running(flag, a_file, tmp_path, capsys):
    from openclaw_ref.bench.cli import main as bench_main

    line = _rejected([flag, str(a_file / "x")], capsys, entry=bench_main)
    assert flag in line and "is not a directory" in line
    assert "is a directory" in _rejected([flag, str(tmp_path)], capsys, entry=bench_main)
    line = _rejected(["--cache-dir", str(a_file)], capsys, entry=bench_main)
    assert "--cache-dir" in line


def _subcommand_parsers() -> dict[str, argparse.ArgumentParser]:
    (sub,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(sub.choices)


@pytest.mark.parametrize("command", [[], ["train"], ["compare"]])
def test_help_imports_no_torch(command):
    """``--help`` answers at once: a fresh interpreter running it never imports torch."""
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "openclaw_ref", *command,
                           "--help"], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert proc.returncode == 0 and "usage: openclaw-bench" in proc.stdout
    imported = {line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines()}
    assert "openclaw_ref.cli" in imported and "torch" not in imported


def test_version_prints_the_package_version(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.strip() == f"openclaw-bench {package_version()}"
    assert package_version()[0].isdigit() or "not installed" in package_version()


def test_every_option_has_help_text_and_its_help_shows_the_default():
    for name, parser in _subcommand_parsers().items():
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            assert action.help and action.help.strip(), f"{name} {action.option_strings}"
        text = parser.format_help()
        assert "``" not in text, name
        assert "(default: " in text or len(parser._actions) == 1, name  # verify-scale: no options
    assert "``" not in build_parser().format_help()


def test_the_clis_plain_choice_lists_equal_their_torch_backed_homes():
    from openclaw_ref.arms.config import Planner
    from openclaw_ref.arms.registry import STRATEGIES
    from openclaw_ref.conformance.cluster import CHECKS
    from openclaw_ref.conformance.settings import ConformSettings
    from openclaw_ref.core.model import PRESETS
    from openclaw_ref.experiments.hook_cost import ARMS
    from openclaw_ref.experiments.registry import SECTIONS
    from openclaw_ref.sync.base import Guard, NonFinitePolicy, WatchdogAction, Wire

    assert choices.PRESETS == tuple(PRESETS)
    assert choices.STRATEGIES == tuple(STRATEGIES)
    assert choices.WIRES == tuple(Wire)
    assert choices.GUARDS == tuple(Guard)
    assert choices.PLANNERS == tuple(Planner)
    assert choices.NONFINITE_POLICIES == tuple(NonFinitePolicy)
    assert choices.WATCHDOG_ACTIONS == tuple(WatchdogAction)
    assert choices.SECTIONS == tuple(SECTIONS)
    assert choices.CHECKS == tuple(CHECKS)
    assert choices.CONFORM_FAULTS == tuple(ConformSettings().faults)
    assert choices.HOOK_COST_ARMS == tuple(ARMS)


TRAIN_SHORT = ("train", "--world-size", "2", "--steps", "12", "--global-batch", "8",
               "--eval-every", "0")


def _run_with_stderr_on_a_terminal(*args: str) -> tuple[int, str]:
    """``python -m openclaw_ref ARGS`` with stderr on a pseudo-terminal of 120 columns;
    (exit code, what the terminal showed)."""
    main_end, rank_end = pty.openpty()
    fcntl.ioctl(rank_end, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))
    proc = subprocess.Popen([sys.executable, "-m", "openclaw_ref", *args], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=rank_end)
    os.close(rank_end)
    shown = b""
    while chunk := _read_or_eof(main_end):
        shown += chunk
    os.close(main_end)
    return proc.wait(timeout=180), shown.decode(errors="replace")


def _read_or_eof(fd: int) -> bytes:
    try:
        return os.read(fd, 4096)
    except OSError:  # EIO: every writer closed the terminal
        return b""


def test_progress_bar_is_drawn_on_a_terminal_and_labels_rank_0s_loss():
    code, shown = _run_with_stderr_on_a_terminal(*TRAIN_SHORT)
    assert code == 0
    assert "rank 0 loss" in shown and "step/s" in shown
    assert "leaked semaphore" not in shown


# 10 s: the slow profile (CI budget); CI draws the bar on a terminal above
@pytest.mark.slow
def test_no_progress_bar_on_a_stderr_that_is_no_terminal_and_no_leaked_semaphore():
    result = run_cli(*TRAIN_SHORT)
    assert result.returncode == 0, result.stderr
    assert "step/s" not in result.stderr and "\r" not in result.stderr
    assert "leaked semaphore" not in result.stderr
