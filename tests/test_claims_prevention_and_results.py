"""Seed 000's prevention (P), result (R) and question (Q) rules, each driven to every outcome it
declares."""

from __future__ import annotations

import pytest
from claims_records import (
    NCCL8,
    NOISY,
    Case,
    assert_reaches,
    barrier,
    case_ids,
    curve,
    curves,
    hardened_paired,
    record,
    run,
    strategies,
)

from openclaw_ref.reporting.claims import Verdict
from openclaw_ref.reporting.claims.judging import half_effect

CASES: list[Case] = [
    ("P1", "no NCCL", lambda: record(), Verdict.NOT_MEASURABLE),
    ("P1", "8 GPUs: still no experiment records it", lambda: record({"doctor": {}}, NCCL8),
     Verdict.NOT_MEASURABLE),
    ("P2", "barrier speeds steps", lambda: record(barrier([40.0] * 5, [30.0] * 5)),
     Verdict.REPRODUCED),
    ("P2", "barrier slows steps", lambda: record(barrier([30.0] * 5, [40.0] * 5)),
     Verdict.NOT_REPRODUCED),
    ("P2", "inside the noise", lambda: record(barrier([30 * x for x in NOISY], [30.0] * 5)),
     Verdict.INSIDE_NOISE),
    ("P2", "no per-repeat arms", lambda: record(barrier([40.0] * 5, [30.0] * 5,
                                                        per_repeat=False)), Verdict.NOT_MEASURABLE),
    ("P3", "entropy every step", lambda: record(curves()), Verdict.IMPLEMENTED),
    ("P3", "entropy not finite", lambda: record({"curves": {"x": curve(
        entropy=[float("nan")] * 300)}}), Verdict.NOT_IMPLEMENTED),
    ("P3", "no curves", lambda: record(), Verdict.NOT_MEASURABLE),
    ("R1", "400k checks pass", lambda: record(strategies(run("hardened fp32", 2,
                                                             checks=400_000))), Verdict.REPRODUCED),
    ("R1", "1% of checks fail", lambda: record(strategies(run("hardened fp32", 2, checks=1000,
                                                              failed_checks=10))),
     Verdict.NOT_REPRODUCED),
    ("R1", "too few checks", lambda: record(strategies(run("hardened fp32", 2, checks=5000))),
     Verdict.NOT_MEASURABLE),
    ("R2", "CV 10× lower", lambda: record(hardened_paired([0.5] * 5, [0.05] * 5)),
     Verdict.REPRODUCED),
    ("R2", "CV equal", lambda: record(hardened_paired([0.1] * 5, [0.1] * 5)),
     Verdict.NOT_REPRODUCED),
    ("R2", "inside the noise", lambda: record(hardened_paired(
        [0.1 * half_effect(0.187 / 0.023) * x for x in NOISY], [0.1] * 5)), Verdict.INSIDE_NOISE),
    ("R2", "ddp never failed", lambda: record(hardened_paired([0.5] * 5, [0.05] * 5,
                                                               ddp_failed=False)),
     Verdict.NOT_MEASURABLE),
    ("R2", "3 repeats", lambda: record(hardened_paired([0.5] * 3, [0.05] * 3)),
     Verdict.NOT_MEASURABLE),
    ("R3", "baseline consistent", lambda: record(curves()), Verdict.NOT_MEASURABLE),
    ("R3", "fix converges 4× sooner", lambda: record({"curves": {
        "ddp": curve(validation=[{"step": s, "loss": 2.0 - s / 100} for s in range(0, 300, 2)],
                     equal=False),
        "hardened fp32": curve(validation=[{"step": s, "loss": 2.0 - s / 25}
                                           for s in range(0, 300, 2)])}}), Verdict.REPRODUCED),
    ("R3", "same convergence", lambda: record(curves(equal=False)), Verdict.NOT_REPRODUCED),
    ("R4", "fix peaks 25% lower", lambda: record(strategies(
        run("ddp", 2, peak=400, scope="run"), run("hardened fp32", 2, peak=300, scope="run"))),
     Verdict.REPRODUCED),
    ("R4", "same peak", lambda: record(strategies(
        run("ddp", 2, peak=400, scope="run"), run("hardened fp32", 2, peak=400, scope="run"))),
     Verdict.NOT_REPRODUCED),
    ("R4", "gradients smaller than the saving to judge", lambda: record(strategies(
        {**run("ddp", 2, peak=400, scope="run"), "costs": {"wire_bytes": 422_576}},
        run("hardened fp32", 2, peak=300, scope="run"))), Verdict.NOT_MEASURABLE),
    ("R4", "gradients larger than the saving to judge", lambda: record(strategies(
        {**run("ddp", 2, peak=400, scope="run"), "costs": {"wire_bytes": 400 * 2**20}},
        run("hardened fp32", 2, peak=300, scope="run"))), Verdict.REPRODUCED),
    ("R4", "per-process peaks only", lambda: record(strategies(
        run("ddp", 2, peak=400), run("hardened fp32", 2, peak=300))), Verdict.NOT_MEASURABLE),
    ("R5", "gloo", lambda: record(), Verdict.NOT_MEASURABLE),
    ("R5", "8 GPUs: still no experiment records it", lambda: record(strategies(run("ddp", 2)),
                                                                      NCCL8),
     Verdict.NOT_MEASURABLE),
    ("Q1", "open", lambda: record(), Verdict.OPEN_QUESTION),
    ("Q2", "open", lambda: record(), Verdict.OPEN_QUESTION),
]


@pytest.mark.parametrize(("claim_id", "name", "make", "expected"), CASES, ids=case_ids(CASES))
def test_rule_reaches_outcome(claim_id, name, make, expected):
    assert_reaches(claim_id, make(), expected)
