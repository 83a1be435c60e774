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


def test_each_asv_round_of_the_hook_cost_reads_its_own_fresh_job(tmp_path, monkeypatch):
    import openclaw_ref.experiments.hook_cost as hook_cost
    from openclaw_ref.bench.cache import hook_cost_figures

    jobs = []

    def fake_run(cfg, threads_per_rank=1):
        jobs.append(cfg)
        return {"summary": {"job": len(jobs)}}

    monkeypatch.setattr(hook_cost, "run", fake_run)
    cache, settings = CaseCache(tmp_path), BenchSettings(max_world=2)
    rounds = [[hook_cost_figures("mlp", settings, cache, figure)["job"]
               for figure in ("fp32.ratio", "fp32.vs_python_hook_ratio")] for _ in range(3)]
    assert rounds == [[1, 1], [2, 2], [3, 3]]  # one job per round, shared by its figures
    assert len(jobs) == 3 and jobs[0].steps == settings.hook_steps
