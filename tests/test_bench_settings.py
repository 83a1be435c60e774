"""The benchmark settings and skips: OPENCLAW_BENCH_* read and checked, unsupported cases
skipped (never faked), and the plain runner that `openclaw-bench compare` calls."""

from __future__ import annotations

import json

import pytest
import torch

from openclaw_ref.arms.config import ArmConfig
from openclaw_ref.arms.registry import STRATEGIES
from openclaw_ref.bench.cli import main
from openclaw_ref.bench.matrix import run_matrix
from openclaw_ref.bench.settings import (
    STRATEGY_CASES,
    BenchSettings,
    auto_backend,
    backend_for,
    require_registered,
    sync_config_for,
)
from openclaw_ref.reporting.render import bench_matrix_markdown
from openclaw_ref.sync.errors import BadInput
from tests.helpers import TINY_BENCH


def test_settings_come_from_openclaw_bench_environment_variables():
    s = BenchSettings.from_env({"OPENCLAW_BENCH_MAX_WORLD": "2", "OPENCLAW_BENCH_PRESET": "tiny",
                                "OPENCLAW_BENCH_STEPS": "5", "OPENCLAW_BENCH_ROUNDS": "1"})
    assert s.world_sizes == (1, 2)
    assert (s.preset, s.steps, s.rounds) == ("tiny", 5, 1)
    assert BenchSettings.from_env({}).world_sizes == (1, 2, 4, 8)


@pytest.mark.parametrize("env", [
    {"OPENCLAW_BENCH_MAX_WORLD": "0"},
    {"OPENCLAW_BENCH_MAX_WORLD": "two"},
    {"OPENCLAW_BENCH_STEPS": "2"},
    {"OPENCLAW_BENCH_GLOBAL_BATCH": "12"},  # not a multiple of 8
    {"OPENCLAW_BENCH_BACKENDS": "gloo,mpi"},
    {"OPENCLAW_BENCH_BACKENDS": "auto,gloo"},
    {"OPENCLAW_BENCH_PRESET": "huge"},
    {"OPENCLAW_BENCH_THREADS": "-1"},
])
def test_settings_reject_bad_values_as_bad_input(env):
    with pytest.raises(BadInput):
        BenchSettings.from_env(env)


def test_a_strategy_not_registered_is_skipped_never_faked():
    with pytest.raises(NotImplementedError, match="not registered"):
        require_registered("no-such-strategy", STRATEGIES)
    with pytest.raises(NotImplementedError):
        sync_config_for("no-such-case")


def test_every_registered_benchmark_strategy_maps_to_its_sync_config():
    for label, fields in STRATEGY_CASES.items():
        if fields["name"] in STRATEGIES:
            assert sync_config_for(label) == ArmConfig.of(**fields)


@pytest.mark.skipif(torch.cuda.is_available() and torch.cuda.device_count() >= 8,
                    reason="this machine has 8 GPUs: nccl at 8 ranks is supported")
def test_nccl_without_one_gpu_per_rank_is_skipped():
    explicit = BenchSettings(backends="nccl,gloo")
    with pytest.raises(NotImplementedError, match="nccl needs 8 GPUs"):
        backend_for(8, "nccl", explicit)


def test_an_auto_matrix_runs_only_the_backend_auto_picks():
    auto = BenchSettings()
    for w in auto.world_sizes:
        assert backend_for(w, auto_backend(w), auto) == auto_backend(w)
    if not torch.cuda.is_available():
        assert auto.backend_params() == ("gloo",)


# --- the plain runner (what `openclaw-bench compare` calls) ------------------------------------


def test_run_matrix_lists_skipped_cases_with_their_reason_and_renders_tables():
    result = run_matrix(TINY_BENCH, strategies=["no-such-case"], world_sizes=[1, 2],
                        seed004=False)
    assert result["cases"] == [] and result["failed"] == []
    assert len(result["skipped"]) == 2 * len(TINY_BENCH.backend_params())
    assert all(s["case"].startswith("sync-no-such-case-w") and "no benchmark case" in s["reason"]
               for s in result["skipped"])
    assert result["settings"]["preset"] == "tiny" and result["environment"]["torch"]
    json.dumps(result)
    assert "no-such-case" in bench_matrix_markdown(result)


def test_plain_runner_rejects_bad_settings_with_exit_code_2():
    with pytest.raises(SystemExit) as exc:
        main(["--steps", "1"])
    assert exc.value.code == 2
