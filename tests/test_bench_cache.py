"""The benchmark job cache: each job runs once per settings digest, skips and failures are
remembered, and each asv round of the hook cost reads a fresh job."""

from __future__ import annotations

import pytest

from openclaw_ref.bench.cache import CaseCache
from openclaw_ref.bench.settings import BenchSettings


def test_case_cache_runs_each_job_once(tmp_path):
    calls = []

    def job():
        calls.append(1)
        return {"median_step_ms": 12.5}

    cache = CaseCache(tmp_path)
    assert cache.get("sync-ddp-w2-gloo", job) == {"median_step_ms": 12.5}
    assert cache.get("sync-ddp-w2-gloo", job) == {"median_step_ms": 12.5}
    assert len(calls) == 1


def test_cached_figures_are_keyed_by_the_settings_that_produced_them():
    a, b = BenchSettings(steps=12), BenchSettings(steps=13)
    assert a.digest() != b.digest()
    assert a.digest() == BenchSettings(steps=12, max_world=2).digest()  # same case, same figures


def test_case_cache_remembers_skips_and_failures(tmp_path):
    calls = []

    def unsupported():
        calls.append(1)
        raise NotImplementedError("nccl needs 8 GPUs")

    def broken():
        calls.append(1)
        raise ValueError("rank 1 died")

    cache = CaseCache(tmp_path)
    for _ in range(2):
        with pytest.raises(NotImplementedError, match="nccl needs 8 GPUs"):
            cache.get("a", unsupported)
        with pytest.raises(RuntimeError, match="rank 1 died"):
            cache.get("b", broken)
    assert len(calls) == 2


def test_every_hook_cost_figure_is_the_median_of_three_cached_jobs(tmp_path):
    """asv runs a ``track_*`` once per commit, so the three jobs behind a figure are made by
    the cache: with three finished jobs on disk, no job runs and each figure is their median
    (a string figure is the first job's)."""
    from openclaw_ref.bench.cache import HOOK_COST_JOBS, hook_cost_figures
    from openclaw_ref.core.jsonio import write_json_atomic

    settings = BenchSettings(max_world=2)
    ratios = [1.30, 1.10, 1.20]
    for job, ratio in enumerate(ratios):
        figures = {"arms": {"hardened": {"ratio": ratio, "buckets": 8 + job}},
                   "pairs": {"hardened/floor": {"arm": "hardened", "over": "floor",
                                                "ratio": ratio - 0.2}}}
        write_json_atomic(tmp_path / f"hookcost-mlp-{settings.digest()}-{job}.json",
                          {"figures": figures})
    got = hook_cost_figures("mlp", settings, CaseCache(tmp_path))
    assert HOOK_COST_JOBS == len(ratios)
    assert got["arms"]["hardened"] == {"ratio": 1.20, "buckets": 9}
    assert got["pairs"]["hardened/floor"] == {"arm": "hardened", "over": "floor",
                                              "ratio": pytest.approx(1.00)}


def test_every_fsdp_cost_figure_is_the_median_of_three_cached_jobs_of_its_mesh(tmp_path):
    """The FSDP2 arms' figures are made the same way, one set of three jobs per world size and
    mesh; a world size over the run's maximum, or a (dp, tp) mesh those ranks cannot make, is
    asv's skip."""
    from openclaw_ref.bench.cache import fsdp_cost_figures
    from openclaw_ref.core.jsonio import write_json_atomic

    settings = BenchSettings(max_world=4)
    for name, ratios in (("1r", [0.9, 0.8, 0.7]), ("4r", [1.04, 1.01, 0.99]),
                         ("4r-tp2", [1.2, 1.06, 1.1])):
        for job, ratio in enumerate(ratios):
            write_json_atomic(tmp_path / f"fsdpcost-mlp-{name}-{settings.digest()}-{job}.json",
                              {"figures": {"hardened-fsdp": {"ratio": ratio}}})
    cache = CaseCache(tmp_path)
    assert fsdp_cost_figures("mlp", 1, settings, cache)["hardened-fsdp"]["ratio"] == 0.8
    assert fsdp_cost_figures("mlp", 4, settings, cache)["hardened-fsdp"]["ratio"] == 1.01
    assert fsdp_cost_figures("mlp", 4, settings, cache, tp=2)["hardened-fsdp"]["ratio"] == 1.1
    with pytest.raises(NotImplementedError, match="no \\(dp, tp\\) mesh of tp 2 on 2 ranks"):
        fsdp_cost_figures("mlp", 2, settings, cache, tp=2)
    with pytest.raises(NotImplementedError, match="maximum world size"):
        fsdp_cost_figures("mlp", 4, BenchSettings(max_world=2), cache)
