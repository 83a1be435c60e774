"""Seed 004's Lightning rules (L), each driven to every outcome it declares."""

from __future__ import annotations

import pytest
from claims_records import (
    BY_ID,
    CPU8,
    NCCL8,
    NOISY,
    QUANT,
    Case,
    assert_reaches,
    case_ids,
    lightning,
    precision,
    record,
)

from openclaw_ref.reporting.claims import Verdict, assess
from openclaw_ref.reporting.claims.judging import half_effect

CASES: list[Case] = [
    ("L1", "no GPU", lambda: record(), Verdict.NOT_MEASURABLE),
    ("L1", "slow on a GPU", lambda: record(precision([2.0], [0.5], 4), NCCL8), Verdict.REPRODUCED),
    ("L1", "fast on a GPU", lambda: record(precision([0.01], [0.005], 4), NCCL8),
     Verdict.NOT_REPRODUCED),
    ("L2", "DDP + mixed precision", lambda: record({"lightning": lightning()}),
     Verdict.IMPLEMENTED),
    ("L2", "one device", lambda: record({"lightning": lightning(ok=False)}),
     Verdict.NOT_IMPLEMENTED),
    ("L2", "not run", lambda: record(), Verdict.NOT_MEASURABLE),
    ("L3", "no GPUs", lambda: record(precision([0.4] * 5, [0.1] * 5, 4)), Verdict.NOT_MEASURABLE),
    ("L3", "seed's 5.25×", lambda: record(precision([0.42] * 5, [0.08] * 5, 4), NCCL8),
     Verdict.REPRODUCED),
    ("L3", "no speed-up", lambda: record(precision([0.1] * 5, [0.1] * 5, 4), NCCL8),
     Verdict.NOT_REPRODUCED),
    ("L3", "inside the noise", lambda: record(precision(
        [half_effect(5.25) * x for x in NOISY], [1.0] * 5, 4), NCCL8), Verdict.INSIDE_NOISE),
    ("L4", "all three", lambda: record({"lightning": lightning(), "quantization": QUANT}),
     Verdict.IMPLEMENTED),
    ("L4", "int8 failed", lambda: record({"lightning": lightning(),
                                          "quantization": {"error": "no fbgemm"}}),
     Verdict.NOT_IMPLEMENTED),
    ("L4", "FX failed, dynamic int8 instead", lambda: record({"lightning": lightning(),
                                                              "quantization": SUBSTITUTED}),
     Verdict.IMPLEMENTED),
    ("L4", "not run", lambda: record({"lightning": lightning()}), Verdict.NOT_MEASURABLE),
    ("L5", "4 ranks on 2 cores", lambda: record(precision([0.4] * 5, [0.1] * 5, 4, "fp32")),
     Verdict.NOT_MEASURABLE),
    ("L5", "4× on 4 cores", lambda: record(precision([0.4] * 5, [0.1] * 5, 4, "fp32"), CPU8),
     Verdict.REPRODUCED),
    ("L5", "1.2× on 4 cores", lambda: record(precision([0.12] * 5, [0.1] * 5, 4), CPU8),
     Verdict.NOT_REPRODUCED),
    ("L5", "inside the noise", lambda: record(precision(
        [half_effect(3.2) * x for x in NOISY], [1.0] * 5, 4), CPU8), Verdict.INSIDE_NOISE),
]


SUBSTITUTED = {**QUANT, "method": "dynamic int8", "fx_error": "TypeError: ones()"}


@pytest.mark.parametrize(("claim_id", "name", "make", "expected"), CASES, ids=case_ids(CASES))
def test_rule_reaches_outcome(claim_id, name, make, expected):
    assert_reaches(claim_id, make(), expected)


def test_l4_says_what_was_substituted_for_the_seeds_fx_path():
    quantized = {"lightning": lightning(), "quantization": SUBSTITUTED}
    finding = assess(BY_ID["L4"], record(quantized))
    assert "substituted: dynamic int8" in finding.reason and "TypeError" in finding.reason
    assert assess(BY_ID["L4"], record({"lightning": lightning(),
                                       "quantization": QUANT})).reason == ""


def test_l1_on_one_gpu_names_a_command_that_asks_for_one_rank():
    finding = assess(BY_ID["L1"], record())
    assert "--world-sizes 1 " in finding.command
