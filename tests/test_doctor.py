"""``openclaw-bench doctor``: the NCCL version floor (seed P1) and the NCCL env lint (seed F4)."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from openclaw_ref.ops.doctor import (
    NCCL_FLOOR,
    diagnose,
    doctor_exit_code,
    lint_environment,
    nccl_version_findings,
    parse_nccl_version,
)
from openclaw_ref.sync.errors import EXIT_ENVIRONMENT
from tests.helpers import run_cli

CPU_FACTS = {"gloo_available": True, "nccl_available": False, "nccl_version": None}


def gpu_facts(version: str) -> dict:
    return {"gloo_available": True, "nccl_available": True, "nccl_version": version}


@pytest.mark.parametrize("reported, expected", [
    ((2, 13, 4), (2, 13, 4)),
    ("2.21.5", (2, 21, 5)),
    ("2.18.1+cuda12.1", (2, 18, 1)),
    ("2.12", (2, 12, 0)),
    (21304, (2, 13, 4)),  # NCCL_VERSION_CODE since 2.9: major*10000 + minor*100 + patch
    (2708, (2, 7, 8)),  # before 2.9: major*1000 + minor*100 + patch
    (None, None),
    ("unknown", None),
])
def test_nccl_version_is_parsed_from_every_form_torch_and_nccl_report(reported, expected):
    assert parse_nccl_version(reported) == expected


@pytest.mark.parametrize("version", ["2.12.12", "2.13.3", "2.7.8", (2, 10, 3), 21207])
def test_nccl_older_than_floor_is_refused_for_the_nccl_backend(version):
    (finding,) = nccl_version_findings(version, "nccl")
    assert finding.level == "error" and finding.code == "nccl-too-old"
    assert "2.13.4" in finding.message and "gloo" in finding.message


@pytest.mark.parametrize("version", ["2.13.4", "2.13.5", "2.14.0", "2.21.5", (3, 0, 0), 22703])
def test_nccl_at_or_above_floor_is_accepted(version):
    assert all(f.level == "info" for f in nccl_version_findings(version, "nccl"))


def test_old_nccl_is_refused_under_auto_backend_too():
    assert nccl_version_findings("2.12.12", "auto")[0].level == "error"


def test_old_nccl_is_irrelevant_for_gloo():
    assert nccl_version_findings("2.12.12", "gloo") == []


def test_nccl_backend_without_nccl_is_an_error_but_auto_falls_back_to_gloo():
    assert nccl_version_findings(None, "nccl")[0].level == "error"
    assert nccl_version_findings(None, "auto")[0].level == "info"


def test_floor_is_the_seeds_version():
    assert NCCL_FLOOR == (2, 13, 4)


def by_variable(env: dict) -> dict:
    return {f.variable: f for f in lint_environment(env)}


def test_ring_algo_is_an_error_naming_nccl_algo():
    f = by_variable({"NCCL_RING_ALGO": "1"})["NCCL_RING_ALGO"]
    assert f.level == "error" and f.replacement == "NCCL_ALGO=Ring"
    assert "NCCL_ALGO=Ring" in f.message


def test_min_nrings_is_a_deprecation_naming_min_nchannels():
    f = by_variable({"NCCL_MIN_NRINGS": "4"})["NCCL_MIN_NRINGS"]
    assert f.level == "warning" and f.replacement == "NCCL_MIN_NCHANNELS"
    assert "NCCL_MIN_NCHANNELS=4" in f.message


def test_min_nrings_shadowed_by_min_nchannels_says_so():
    f = by_variable({"NCCL_MIN_NRINGS": "4", "NCCL_MIN_NCHANNELS": "8"})["NCCL_MIN_NRINGS"]
    assert "takes precedence" in f.message


@pytest.mark.parametrize("value", ["", "  "])
def test_empty_buffsize_is_an_error(value):
    f = by_variable({"NCCL_BUFFSIZE": value})["NCCL_BUFFSIZE"]
    assert f.level == "error" and f.code == "empty-nccl-variable"


def test_non_integer_buffsize_is_an_error():
    assert by_variable({"NCCL_BUFFSIZE": "2MB"})["NCCL_BUFFSIZE"].code == "invalid-nccl-variable"


def test_integer_buffsize_is_fine():
    assert lint_environment({"NCCL_BUFFSIZE": "2097152"}) == []


def test_async_error_handling_names_the_torch_variable():
    f = by_variable({"NCCL_ASYNC_ERROR_HANDLING": "1"})["NCCL_ASYNC_ERROR_HANDLING"]
    assert f.level == "warning" and f.replacement == "TORCH_NCCL_ASYNC_ERROR_HANDLING"


def test_distributed_debug_detail_warns_about_the_gloo_segfault():
    assert by_variable({"TORCH_DISTRIBUTED_DEBUG": "DETAIL"})["TORCH_DISTRIBUTED_DEBUG"].level \
        == "warning"


def test_current_variables_are_not_reported():
    env = {"NCCL_ALGO": "Ring", "NCCL_MIN_NCHANNELS": "4", "NCCL_BUFFSIZE": "2097152",
           "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1", "NCCL_DEBUG": "WARN"}
    assert lint_environment(env) == []


def test_exit_code_is_5_on_error_0_on_warning_unless_strict():
    error = diagnose(CPU_FACTS, {"NCCL_RING_ALGO": "1"})
    warning = diagnose(CPU_FACTS, {"NCCL_MIN_NRINGS": "4"})
    clean = diagnose(gpu_facts("2.21.5"), {}, backend="nccl")
    assert (error.verdict, warning.verdict, clean.verdict) == ("error", "warning", "ok")
    assert doctor_exit_code(error) == EXIT_ENVIRONMENT == 5
    assert doctor_exit_code(warning) == 0 and doctor_exit_code(warning, strict=True) == 5
    assert doctor_exit_code(clean, strict=True) == 0


def test_old_nccl_on_a_gpu_machine_fails_the_doctor():
    assert doctor_exit_code(diagnose(gpu_facts("2.12.12"), {}, backend="nccl")) == 5


def run_doctor(*args: str, **env: str) -> subprocess.CompletedProcess:
    """``openclaw-bench doctor ARGS`` without this process's NCCL/torch.distributed variables,
    with ``env`` added."""
    full_env = {k: v for k, v in os.environ.items()
                if not k.startswith(("NCCL_", "TORCH_NCCL_", "TORCH_DISTRIBUTED"))}
    full_env.update(env)
    return run_cli("doctor", *args, env=full_env, timeout=120)


def test_cli_names_current_equivalents_of_the_seeds_variables_and_exits_5():
    proc = run_doctor(NCCL_RING_ALGO="1", NCCL_MIN_NRINGS="4")
    assert proc.returncode == 5, proc.stderr
    assert "NCCL_ALGO" in proc.stdout and "NCCL_MIN_NCHANNELS" in proc.stdout
    assert "torch" in proc.stdout and "gloo_available" in proc.stdout


def test_cli_json_reports_facts_and_verdict_on_a_clean_environment():
    proc = run_doctor("--json", "--backend", "gloo")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    assert report["verdict"] == "ok" and report["facts"]["gloo_available"] is True
    assert {"torch", "cuda_available", "gpu_count", "nccl_version"} <= set(report["facts"])


def test_an_option_the_doctor_cannot_parse_is_bad_input_exit_2():
    proc = run_doctor("--backend", "mpi")
    assert proc.returncode == 2 and "invalid choice" in proc.stderr
