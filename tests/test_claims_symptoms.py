"""Seed 000's setting (S) and symptom (C) rules, each driven to every outcome it declares."""

from __future__ import annotations

import pytest
from claims_records import (
    BY_ID,
    NCCL8,
    NOISY,
    Case,
    assert_reaches,
    case_ids,
    curves,
    record,
    repeats,
    run,
    sparsity_ablation,
    spiky_validation,
    strategies,
)

from openclaw_ref.reporting.claims import Verdict, assess
from openclaw_ref.reporting.claims.symptoms import PER_BUCKET

CASES: list[Case] = [
    ("S1", "any environment", lambda: record(), Verdict.SETTING),
    ("S2", "seed range and names", lambda: record(curves()), Verdict.IMPLEMENTED),
    ("S2", "constant sparsity", lambda: record(curves(sparsity=[0.3] * 300)),
     Verdict.NOT_IMPLEMENTED),
    ("S2", "no curves", lambda: record(), Verdict.NOT_MEASURABLE),
    ("C1", "spikes every 40 steps", lambda: record(curves(validation=spiky_validation(40))),
     Verdict.REPRODUCED),
    ("C1", "monotone validation", lambda: record(curves()), Verdict.NOT_REPRODUCED),
    ("C1", "curve too short", lambda: record(curves(validation=spiky_validation(40)[:20])),
     Verdict.NOT_MEASURABLE),
    ("C2", "rank norms 3× apart", lambda: record(strategies(run("ddp", 2, norms=(1.0, 3.0)))),
     Verdict.REPRODUCED),
    ("C2", "rank norms 10% apart", lambda: record(strategies(run("ddp", 2, norms=(1.0, 1.1)))),
     Verdict.NOT_REPRODUCED),
    ("C2", "one rank only", lambda: record(strategies(run("ddp", 1))), Verdict.NOT_MEASURABLE),
    ("C3", "10 ms skew, no masking-off control", lambda: record(strategies(*repeats(
        PER_BUCKET, 2, [10.0] * 5, "skew"))), Verdict.NOT_MEASURABLE),
    ("C3", "0.5 ms skew", lambda: record(strategies(*repeats(PER_BUCKET, 2, [0.5] * 5,
                                                               "skew"))), Verdict.NOT_REPRODUCED),
    ("C3", "skew around 3 ms", lambda: record(strategies(*repeats(
        PER_BUCKET, 2, [3 * x for x in NOISY], "skew"))), Verdict.INSIDE_NOISE),
    ("C3", "p99 recorded per run", lambda: record({**strategies(*[
        {**run(PER_BUCKET, 2, i), "skew_ms": None,
         "skew_p99_ms": 10.0} for i in range(5)]),
        **sparsity_ablation(0.9, 0.1)}), Verdict.REPRODUCED),
    ("C3", "4 ranks on 2 cores", lambda: record(strategies(*repeats(PER_BUCKET, 4, [10.0] * 5,
                                                                      "skew"))),
     Verdict.NOT_MEASURABLE),
    ("C3", "skew that masking off removes", lambda: record({**strategies(*repeats(
        PER_BUCKET, 2, [10.0] * 5, "skew")), **sparsity_ablation(0.9, 0.1)}),
     Verdict.REPRODUCED),
    ("C3", "the same skew with masking off", lambda: record({**strategies(*repeats(
        PER_BUCKET, 2, [10.0] * 5, "skew")), **sparsity_ablation(0.99, 0.98, w=4)}),
     Verdict.NOT_MEASURABLE),
    ("C3", "3 repeats", lambda: record(strategies(*repeats(PER_BUCKET, 2, [10.0] * 3,
                                                             "skew"))), Verdict.NOT_MEASURABLE),
    ("C4", "skew follows the sparse path", lambda: record(sparsity_ablation(0.9, 0.1)),
     Verdict.REPRODUCED),
    ("C4", "skew without the sparse path", lambda: record(sparsity_ablation(0.99, 0.98)),
     Verdict.NOT_REPRODUCED),
    ("C4", "ablation on 4 ranks, 2 cores", lambda: record(sparsity_ablation(0.9, 0.1, w=4)),
     Verdict.NOT_MEASURABLE),
    ("C5", "shape mismatches", lambda: record(strategies(run(
        "hardened fp32", 2, events=[{"kind": "ShapeMismatch", "step": 1}]))), Verdict.REPRODUCED),
    ("C5", "presence differs, shapes never", lambda: record(strategies(
        run("hardened fp32", 2), run("ddp", 2, presence=False))), Verdict.REFUTED),
    ("C5", "nothing differs", lambda: record(strategies(run("hardened fp32", 2), run("ddp", 2))),
     Verdict.NOT_REPRODUCED),
    ("C5", "no hardened multi-rank run", lambda: record(strategies(run("ddp", 2))),
     Verdict.NOT_MEASURABLE),
    ("C6", "gloo", lambda: record(strategies(run("ddp", 2))), Verdict.NOT_MEASURABLE),
    ("C6", "8 GPUs: still no experiment records it", lambda: record(strategies(
        run("ddp", 2), cuda_sync_ablation={"with": {"collectives": 1000, "failed": 0},
                                           "without": {"collectives": 1000, "failed": 80}}),
        NCCL8), Verdict.NOT_MEASURABLE),
    ("C7", "proxy shown", lambda: record(strategies(run("hardened fp32", 2))),
     Verdict.NOT_MEASURABLE),
]


@pytest.mark.parametrize(("claim_id", "name", "make", "expected"), CASES, ids=case_ids(CASES))
def test_rule_reaches_outcome(claim_id, name, make, expected):
    assert_reaches(claim_id, make(), expected)


def test_skew_the_control_shows_without_masking_is_not_attributed_to_the_sparse_path():
    rec = record({**strategies(*repeats(PER_BUCKET, 2, [10.0] * 5, "skew")),
                  **sparsity_ablation(0.99, 0.98, w=4)})
    finding = assess(BY_ID["C3"], rec)
    assert "not attributable" in finding.reason and "C4 control" in finding.measured


def test_claims_no_experiment_records_say_so_and_offer_no_command():
    for claim_id in ("C6", "P1", "R5"):
        finding = assess(BY_ID[claim_id], record(env=NCCL8))
        assert finding.label == Verdict.NOT_MEASURABLE and finding.command == ""
        assert "needs" in finding.reason and "does not run" in finding.reason
