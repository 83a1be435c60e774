"""Seed 000's cause (M) and fix (F) rules, each driven to every outcome it declares."""

from __future__ import annotations

import pytest
from claims_records import (
    NOISY,
    Case,
    assert_reaches,
    case,
    case_ids,
    curves,
    f2_runs,
    failed,
    fails,
    faults,
    overflow,
    record,
    run,
    scale_mismatch,
    seed_hook_cases,
    strategies,
)

from openclaw_ref.reporting.claims import Verdict
from openclaw_ref.reporting.claims.judging import half_effect

CASES: list[Case] = [
    ("M1", "late rank misaligns buckets", lambda: record(faults([case(
        "late-rank", "ddp", "detected", kind="BucketMisalignment")])), Verdict.REPRODUCED),
    ("M1", "no shift at 250 ms", lambda: record(faults([case("late-rank", "ddp", "no-effect")]))
     , Verdict.REFUTED),
    ("M1", "no shift at 1 ms", lambda: record(faults([case("late-rank", "ddp", "no-effect")],
                                                      late="1ms")), Verdict.NOT_REPRODUCED),
    ("M1", "no fault matrix", lambda: record(), Verdict.NOT_MEASURABLE),
    ("M2", "proxy shown", lambda: record(curves()), Verdict.NOT_MEASURABLE),
    ("M3", "layouts differ", lambda: record(faults(alignment=[
        {"strategy": "ddp", "world_size": 2, "aligned": False, "steps": 6}])), Verdict.REPRODUCED),
    ("M3", "layouts identical", lambda: record(faults(alignment=[
        {"strategy": "ddp", "world_size": 2, "aligned": True, "steps": 6}])), Verdict.REFUTED),
    ("M3", "not recorded", lambda: record(faults()), Verdict.NOT_MEASURABLE),
    ("M4", "overflows at 8 ranks", lambda: record(scale_mismatch(8, 100, 5, 5)),
     Verdict.REPRODUCED),
    ("M4", "corrupts silently", lambda: record(scale_mismatch(8, 100, 0, 10)), Verdict.REFUTED),
    ("M4", "rarely overflows", lambda: record(scale_mismatch(8, 1000, 1, 0)),
     Verdict.NOT_REPRODUCED),
    ("M4", "2 ranks only", lambda: record(scale_mismatch(2, 100, 5, 5)), Verdict.NOT_MEASURABLE),
    ("M4", "overflow the uniform control has too", lambda: record(
        scale_mismatch(8, 120, 44, 120, uniform=46)), Verdict.REFUTED),
    ("M4", "no uniform control recorded", lambda: record({"overflow": {"scale_mismatch": [
        {"world_size": 8, "allreduces": 10, "overflowed": 5, "corrupted": 5}]}}),
     Verdict.NOT_MEASURABLE),
    ("F1", "baseline never fails", lambda: record(strategies(run("ddp", 2),
                                                             run("hardened fp32", 2))),
     Verdict.NOT_MEASURABLE),
    ("F1", "hardened removes failures", lambda: record(strategies(
        *fails("ddp", 2), run("ddp", 2, 3), run("hardened fp32", 2))), Verdict.REPRODUCED),
    ("F1", "hardened fails as often", lambda: record(strategies(
        run("ddp", 2, equal=False), run("hardened fp32", 2, equal=False))), Verdict.NOT_REPRODUCED),
    ("F2", "seed planner misaligns", lambda: record(strategies(
        failed("bucketed norm-ema (text 000's F2)", 2, kind="BucketMisalignment"))),
     Verdict.REFUTED),
    ("F2", "seed planner 1.5× faster", lambda: record(f2_runs([60.0] * 5, [40.0] * 5)),
     Verdict.REPRODUCED),
    ("F2", "seed planner as fast", lambda: record(f2_runs([40.0] * 5, [40.0] * 5)),
     Verdict.NOT_REPRODUCED),
    ("F2", "gain inside the noise", lambda: record(f2_runs(
        [40 * half_effect(1.372) * x for x in NOISY], [40.0] * 5)), Verdict.INSIDE_NOISE),
    ("F2", "4 ranks on 2 cores", lambda: record(f2_runs([60.0] * 5, [40.0] * 5, w=4)),
     Verdict.NOT_MEASURABLE),
    ("F3", "uniform scale overflows more", lambda: record(overflow(0.0, 0.0008)), Verdict.REFUTED),
    ("F3", "uniform scale cuts overflow", lambda: record(overflow(0.01, 0.0001)),
     Verdict.REPRODUCED),
    ("F3", "cuts, not to 0.017%", lambda: record(overflow(0.01, 0.005)), Verdict.NOT_REPRODUCED),
    ("F3", "baseline never overflows", lambda: record(overflow(0.0, 0.0)), Verdict.NOT_MEASURABLE),
    ("F4", "lint error", lambda: record({"doctor": {"findings": [
        {"level": "error", "variable": "NCCL_RING_ALGO", "replacement": "NCCL_ALGO=Ring"}]}}),
     Verdict.REFUTED),
    ("F4", "names valid", lambda: record({"doctor": {"findings": [
        {"level": "warning", "variable": "NCCL_MIN_NRINGS", "replacement": "x"}]}}),
     Verdict.NOT_MEASURABLE),
    ("F5", "breaks a clean run", lambda: record(seed_hook_cases("crash", ())), Verdict.REFUTED),
    ("F5", "catches scale and layout", lambda: record(seed_hook_cases("no-effect", (
        "scale-mismatch", "local-buckets"))), Verdict.REPRODUCED),
    ("F5", "catches nothing", lambda: record(seed_hook_cases("no-effect", ())),
     Verdict.NOT_REPRODUCED),
    ("F5", "hook not run", lambda: record(faults()), Verdict.NOT_MEASURABLE),
]


@pytest.mark.parametrize(("claim_id", "name", "make", "expected"), CASES, ids=case_ids(CASES))
def test_rule_reaches_outcome(claim_id, name, make, expected):
    assert_reaches(claim_id, make(), expected)
