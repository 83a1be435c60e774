"""The benchmark harness's figure arithmetic: bandwidths, percentiles, a job's sync figures,
wire bytes, and the speed targets (reported by the benchmarks, never asserted: here only their
arithmetic)."""

from __future__ import annotations

import numpy as np
import pytest

from openclaw_ref.bench.figures import algbw_gbps, busbw_gbps, parameter_bytes, sync_figures
from openclaw_ref.bench.targets import STEP_RATIO_TARGET, targets
from openclaw_ref.core.metrics import percentile


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


def test_the_step_ratio_is_judged_against_the_one_speed_target():
    cases = [_case("ddp", 2, 100.0, 10.0, 8.0), _case("hardened-fp32", 2, 104.0, 14.0, 8.0),
             _case("ddp", 4, 100.0, 10.0, 8.0), _case("hardened-fp32", 4, 106.0, 16.0, 8.0)]
    rows = {r.world_size: r for r in targets(cases) if r.target == "hardened fp32 step / ddp step"}
    assert STEP_RATIO_TARGET == 1.05
    assert {w: (r.threshold, r.met) for w, r in rows.items()} == {2: (1.05, True), 4: (1.05, False)}


def test_fp16_target_is_not_judged_where_half_the_bytes_are_not_faster():
    cases = [_case("ddp", 2, 100.0, 10.0, 8.0), _case("ddp-fp16", 2, 99.0, 9.0, 7.5)]
    row = next(r for r in targets(cases) if r.target == "ddp-fp16 sync / ddp sync")
    assert row.met is None and "not bandwidth-bound" in row.note
