"""The benchmark harness: figure arithmetic, skips, the job cache, real jobs, and an asv smoke run.

Speed targets are never asserted here (they are reported by the benchmarks); these tests check
that every figure is computed as documented, that unsupported cases skip instead of failing,
and that asv itself can run the suite.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from openclaw_ref.bench.cache import CaseCache
from openclaw_ref.bench.cli import main
from openclaw_ref.bench.figures import algbw_gbps, busbw_gbps, parameter_bytes, sync_figures
from openclaw_ref.bench.jobs import run_seed004_case, run_sync_case
from openclaw_ref.bench.matrix import run_matrix
from openclaw_ref.bench.rank_tasks import raw_allreduce_rank
from openclaw_ref.bench.settings import (
    STRATEGY_CASES,
    BenchSettings,
    auto_backend,
    backend_for,
    require_registered,
    sync_config_for,
)
from openclaw_ref.bench.targets import targets
from openclaw_ref.core.metrics import percentile
from openclaw_ref.reporting.render import bench_matrix_markdown
from openclaw_ref.sync import STRATEGIES
from openclaw_ref.sync.base import SyncConfig
from openclaw_ref.sync.errors import BadInput

ROOT = Path(__file__).resolve().parents[1]
TINY = BenchSettings(preset="tiny", steps=3, global_batch=8, raw_iters=2, rounds=1, max_world=2)


# --- figure arithmetic -------------------------------------------------------------------------


def test_busbw_is_algbw_times_two_n_minus_one_over_n():
    assert busbw_gbps(10.0, 2) == pytest.approx(10.0)
    assert busbw_gbps(10.0, 4) == pytest.approx(15.0)
    assert busbw_gbps(10.0, 8) == pytest.approx(17.5)
    assert busbw_gbps(10.0, 1) == 0.0


def test_algbw_is_bytes_over_seconds_in_gigabytes():
    assert algbw_gbps(2_000_000_000, 0.5) == pytest.approx(4.0)


@pytest.mark.parametrize("q", [0, 1, 50, 99, 100])
def test_percentile_matches_numpys_linear_interpolation(q):
    values = [3.0, 1.0, 4.0, 1.5, 9.0, 2.6, 5.0]
    assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)))


def test_sync_figures_pool_every_bucket_skew_and_count_overflowed_elements():
    steps = [
        {"sync": {"sync_ms": 99.0, "buckets": [{"skew_ms": 50.0}],
                  "overflow_elements": 7, "elements": 10}},  # warm-up: excluded
        {"sync": {"sync_ms": 2.0, "buckets": [{"skew_ms": 1.0}, {"skew_ms": 3.0}],
                  "overflow_elements": 1, "elements": 100, "checks_run": 2, "checks_passed": 2}},
        {"sync": {"sync_ms": 4.0, "buckets": [{"skew_ms": 2.0}, {"skew_ms": 4.0}],
                  "overflow_elements": 0, "elements": 100, "checks_run": 2, "checks_passed": 2}},
    ]
    got = sync_figures(steps, warmup=1)
    assert got["sync_ms"] == 3.0
    assert got["skew_p50_ms"] == pytest.approx(2.5)
    assert got["skew_p99_ms"] == pytest.approx(float(np.percentile([1, 3, 2, 4], 99)))
    assert got["overflow_rate"] == pytest.approx(1 / 200)
    assert (got["checks_run"], got["checks_passed"]) == (4, 4)
    assert got["sync_ms_cv"] == pytest.approx(1 / 3)


def test_sync_figures_are_none_where_a_strategy_reports_nothing():
    got = sync_figures([{"sync": {}}, {"sync": {}}, {"sync": {}}])
    assert got["skew_p50_ms"] is None and got["overflow_rate"] is None and got["sync_ms"] is None
    assert got["checks_run"] is None  # no checks is not "zero checks passed"


def test_stock_ddp_puts_every_parameter_on_the_wire_in_its_dtype():
    numel32, bytes32 = parameter_bytes("tiny", "fp32")
    numel16, bytes16 = parameter_bytes("tiny", "fp16")
    assert numel32 == numel16 and bytes32 == 4 * numel32 and bytes16 == 2 * numel16


# --- settings and skips ------------------------------------------------------------------------


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
            assert sync_config_for(label) == SyncConfig(**fields)


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


# --- the job cache -----------------------------------------------------------------------------


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


# --- targets (reported, never asserted: here only their arithmetic) ----------------------------


def _case(label, w, step, exposed, raw, sync_over_raw=None):
    return {"kind": "sync", "strategy": label, "world_size": w, "median_step_ms": step,
            "local_median_step_ms": step - exposed, "exposed_sync_ms": exposed,
            "raw_allreduce_ms": raw, "sync_over_raw": sync_over_raw}


def test_targets_compare_strategies_within_one_world_size():
    cases = [_case("ddp", 2, 100.0, 10.0, 8.0, 1.25),
             _case("hardened-fp32", 2, 102.0, 12.0, 8.0, 1.5),
             _case("ddp-detail", 2, 150.0, 50.0, 8.0),  # a slower job: floor 100 vs 90
             _case("hardened-fp16", 2, 97.0, 5.0, 4.0), _case("ddp", 4, 300.0, 30.0, 20.0)]
    rows = {(r.target, r.world_size): r for r in targets(cases)}
    assert rows[("hardened fp32 step / ddp step", 2)].value == pytest.approx(1.02)
    assert rows[("hardened fp32 step / ddp step", 2)].met is True
    assert "1.020" in rows[("hardened fp32 step / ddp step", 2)].note  # (90 + 12) / (90 + 10)
    # overheads are differences of exposed sync, each corrected by its own job's floor
    assert rows[("hardened check overhead / DETAIL's", 2)].value == pytest.approx(2 / 40)
    assert rows[("hardened-fp32 exposed sync / raw allreduce", 2)].met is False
    fp16 = rows[("hardened-fp16 sync / hardened-fp32 sync", 2)]
    assert fp16.value == pytest.approx(5 / 12) and fp16.met is True
    assert rows[("hardened fp32 step / ddp step", 4)].met is None  # hardened missing at 4 ranks


def test_fp16_target_is_not_judged_where_half_the_bytes_are_not_faster():
    cases = [_case("ddp", 2, 100.0, 10.0, 8.0), _case("ddp-fp16", 2, 99.0, 9.0, 7.5)]
    row = next(r for r in targets(cases) if r.target == "ddp-fp16 sync / ddp sync")
    assert row.met is None and "not bandwidth-bound" in row.note


# --- real jobs on the shared pools -------------------------------------------------------------


def test_a_sync_job_yields_every_figure_and_exposed_sync_is_step_minus_floor(pools):
    f = run_sync_case("ddp", 2, "gloo", TINY, pool=pools.get(2))
    assert f["backend"] == "gloo" and f["replicas_equal"] and f["events"] == 0
    assert f["exposed_sync_ms"] == pytest.approx(f["median_step_ms"] - f["local_median_step_ms"])
    # the raw allreduce moves exactly the bytes the strategy puts on the wire per step
    assert f["raw_allreduce_bytes"] == f["wire_bytes_per_step"]
    assert f["wire_bytes_per_step"] >= parameter_bytes("tiny", "fp32")[1]
    if f["bytes_source"] == "costs":
        assert f["collectives_per_step"] >= 1 and f["host_syncs_per_step"] is not None
    assert f["raw_allreduce_ms"] > 0
    assert f["raw_busbw_gbps"] == pytest.approx(busbw_gbps(f["raw_algbw_gbps"], 2))
    assert f["raw_algbw_gbps"] == pytest.approx(
        algbw_gbps(f["raw_allreduce_bytes"], f["raw_allreduce_ms"] / 1e3))
    assert f["sync_over_raw"] == pytest.approx(f["exposed_sync_ms"] / f["raw_allreduce_ms"])
    assert all(m > 0 for m in f["peak_memory_mb_per_rank"]) and len(f["step_ms"][0]) == 3
    assert f["skew_p50_ms"] is None  # stock DDP exposes no per-bucket ready times
    json.dumps(f)  # the results command stores it as is


def test_raw_allreduce_sums_on_every_rank_and_reports_the_slowest_rank(pools):
    ms = pools.get(2).run(raw_allreduce_rank, 1000, "fp16", 3)
    assert ms[1] is None and len(ms[0]) == 3 and all(t > 0 for t in ms[0])


def detail_probe(ctx, mismatch: bool):
    """Rank task: build ddp-detail, run one step, optionally issue a mis-shaped collective."""
    import torch.distributed as dist
    import torch.nn.functional as F

    from openclaw_ref.sync import make_strategy

    before = dist.get_debug_level()
    strategy = make_strategy(SyncConfig(name="ddp-detail"))
    model = torch.nn.Linear(4, 2)
    torch.manual_seed(0)
    ddp = strategy.wrap(model, ctx)
    wrapper = type(strategy.group._get_backend(torch.device("cpu"))).__name__
    x = torch.full((3, 4), float(ctx.rank + 1))
    F.mse_loss(ddp(x), torch.zeros(3, 2)).backward()
    grad = model.weight.grad.clone()
    error = None
    if mismatch:
        try:
            dist.all_reduce(torch.ones(1 + ctx.rank), group=strategy.group)
        except RuntimeError as exc:
            error = str(exc)
    strategy.close()
    return {"wrapper": wrapper, "grad": grad, "error": error,
            "level_restored": dist.get_debug_level() == before}


def test_ddp_detail_runs_gradient_buckets_through_the_detail_wrapper(pools):
    out = pools.get(2).run(detail_probe, False)
    assert all(o["wrapper"] == "_ProcessGroupWrapper" for o in out)
    torch.testing.assert_close(out[0]["grad"], out[1]["grad"])  # averaged, as DDP does
    assert all(o["level_restored"] for o in out)


def test_ddp_detail_wrapper_fires_on_a_collective_shape_mismatch_naming_the_ranks(pools):
    out = pools.get(2).run(detail_probe, True)
    for o in out:
        assert "Detected mismatch between collectives" in o["error"]
        assert "Rank 0" in o["error"] and "Rank 1" in o["error"]
        assert "TensorShape=[1]" in o["error"] and "TensorShape=[2]" in o["error"]


def test_amp_rejects_an_unknown_autocast_dtype():
    from openclaw_ref.core.train import TrainConfig

    with pytest.raises(BadInput, match="amp must be one of"):
        TrainConfig(amp="fp8").validate()


def test_seed004_amp_case_trains_one_rank_under_bf16_autocast_on_cpu(pools):
    if torch.cuda.is_available():
        pytest.skip("on a GPU machine the AMP case uses fp16 under NCCL")
    f = run_seed004_case("amp", 1, "gloo", TINY, pool=pools.get(1))
    assert (f["amp_dtype"], f["strategy"]) == ("bf16", "local")
    assert math.isfinite(f["final_loss"]) and f["s_per_iter"] > 0 and f["peak_memory_mb"] > 0


# --- asv itself --------------------------------------------------------------------------------

SMOKE_ENV = {"OPENCLAW_BENCH_MAX_WORLD": "2", "OPENCLAW_BENCH_PRESET": "tiny",
             "OPENCLAW_BENCH_HOOK_STEPS": "5",
             "OPENCLAW_BENCH_STEPS": "3", "OPENCLAW_BENCH_GLOBAL_BATCH": "8",
             "OPENCLAW_BENCH_RAW_ITERS": "2", "OPENCLAW_BENCH_ROUNDS": "1"}


def _head_sha() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True,
                             text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


@pytest.mark.asv
def test_asv_quick_smoke_on_two_ranks_saves_a_value_for_every_runnable_benchmark(tmp_path):
    """``asv run --python=same --quick`` at world sizes ≤ 2, into a scratch results dir (HOME is
    scratch too: asv keeps its machine file there)."""
    pytest.importorskip("asv")
    asv = shutil.which("asv", path=os.path.dirname(sys.executable)) or shutil.which("asv")
    sha = _head_sha()
    if asv is None or sha is None:
        pytest.skip("needs the asv command and a git checkout")
    conf = json.loads("\n".join(line for line in (ROOT / "benchmarks" / "asv.conf.json")
                                .read_text().splitlines() if not line.lstrip().startswith("//")))
    assert conf["results_dir"].startswith(".asv") and conf["html_dir"].startswith(".asv")
    branch = subprocess.run(["git", "rev-parse", "--abbrev-ref", "HEAD"], cwd=ROOT,
                            capture_output=True, text=True, timeout=10).stdout.strip()
    if branch and branch != "HEAD":
        conf["branches"] = [branch]  # a clone on another branch still finds its commit
    conf.update(repo=str(ROOT), benchmark_dir=str(ROOT / "benchmarks" / "benchmarks"),
                results_dir=str(tmp_path / "results"), html_dir=str(tmp_path / "html"),
                env_dir=str(tmp_path / "env"))
    (tmp_path / "asv.conf.json").write_text(json.dumps(conf))
    env = {**os.environ, **SMOKE_ENV, "HOME": str(tmp_path), "ASV_PYTHONPATH": str(ROOT)}
    common = ["--config", str(tmp_path / "asv.conf.json")]
    subprocess.run([asv, "machine", "--yes", "--machine", "smoke", *common], env=env,
                   check=True, capture_output=True, timeout=60)
    run = subprocess.run([asv, "run", "--python=same", "--quick", "--set-commit-hash", sha,
                          "--machine", "smoke", "--show-stderr", *common],
                         env=env, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    [result_file] = [p for p in (tmp_path / "results" / "smoke").glob("*.json")
                     if p.name != "machine.json"]
    results = json.loads(result_file.read_text())["results"]
    assert "failed" not in run.stdout.lower(), run.stdout[-4000:]

    def values(name):
        return results[name][0]

    # ddp at 1 and 2 ranks: every step figure is a number
    step = values("bench_sync.SyncStep.track_median_step_ms")
    strategies = list(STRATEGY_CASES)
    ddp = strategies.index("ddp")
    assert all(v is not None and v > 0 for v in step[ddp * 2: ddp * 2 + 2])
    busbw = values("bench_sync.RawAllreduce.track_busbw")
    assert busbw[ddp * 2 + 1] > 0  # 2 ranks
    s_per_iter = values("bench_seed004.Seed004Matrix.track_s_per_iter")
    assert all(v is not None and v > 0 for v in s_per_iter)
    # a strategy that is not registered is skipped (n/a), never given a number
    for i, label in enumerate(strategies):
        if STRATEGY_CASES[label]["name"] not in STRATEGIES:
            assert step[2 * i] is None or math.isnan(step[2 * i])
    # the gate figures: a ratio per model from the interleaved job; verification timed at W
    gate = values("bench_hooks.HookCost.track_hardened_fp32_over_ddp")
    assert len(gate) == 2 and all(v is not None and v > 0 for v in gate)
    assert all(v is not None and v > 0
               for v in values("bench_hooks.VerifyScale.time_check_blocks_16_buckets"))


# --- the plain runner (what `openclaw-bench compare` calls) ------------------------------------


def test_run_matrix_lists_skipped_cases_with_their_reason_and_renders_tables():
    result = run_matrix(TINY, strategies=["no-such-case"], world_sizes=[1, 2],
                        seed004=False)
    assert result["cases"] == [] and result["failed"] == []
    assert len(result["skipped"]) == 2 * len(TINY.backend_params())
    assert all(s["case"].startswith("sync-no-such-case-w") and "no benchmark case" in s["reason"]
               for s in result["skipped"])
    assert result["settings"]["preset"] == "tiny" and result["environment"]["torch"]
    json.dumps(result)
    assert "no-such-case" in bench_matrix_markdown(result)


def test_plain_runner_rejects_bad_settings_with_exit_code_2():
    with pytest.raises(SystemExit) as exc:
        main(["--steps", "1"])
    assert exc.value.code == 2
