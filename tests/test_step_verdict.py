"""One verdict per step: the step guard's decision is one function of what the ranks exchanged
(the reduced counts, and on a failing step the gathered slots) — fed the same exchange, every
rank raises the same class at the same step, naming the same ranks and parameters in the same
words, or passes with the same figures; whose evidence decides the words is in the slots."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from openclaw_ref.sync.base import SyncConfig
from openclaw_ref.sync.errors import ConsistencyError
from openclaw_ref.sync.evidence.control_counts import CountLayout
from openclaw_ref.sync.evidence.control_counts_write import write_counts
from openclaw_ref.sync.evidence.control_layout import (
    NONFINITE,
    SLOT_FIELDS,
    NotIssued,
    encode_slot,
    joined_slot,
    unissued_slot,
)
from openclaw_ref.sync.evidence.ledger import BucketRecord, CountedStep, Ledger
from openclaw_ref.sync.evidence.precision import ScalePolicy

NAMES = ["embed.weight", "block.weight", "block.bias", "head.weight"]
STEP, DIGEST = 5, 0x0123456789ABCDEF


def _slot(rank: int, kind: str) -> tuple[list[int], bool]:
    """Rank ``rank``'s slot for a step of ``kind``, and its non-finite flag."""
    def enc(**kw):
        fields = dict(clock=STEP, bucket=0, digest=DIGEST, scale_exp=0, ready_s=1e-3 * (rank + 1))
        return encode_slot(**{**fields, **kw})
    slots = {
        "clean": enc(), "nonfinite": enc(), "ahead": enc(clock=STEP + 1),
        "layout": enc(digest=DIGEST ^ 1), "absent": enc(absent=1),
        "stopped": unissued_slot(enc(bucket=1, absent=2), NotIssued.STOPPED),
        "bypassed": unissued_slot(enc(), NotIssued.BYPASSED),
        "replaced": unissued_slot(enc(absent=3), NotIssued.REPLACED),
        "joined": joined_slot(), "silent": [0] * SLOT_FIELDS,
    }
    return slots[kind], kind == "nonfinite"


def _exchange(kinds: list[str]) -> tuple[torch.Tensor, list[list[int]]]:
    """What the step's two collectives deliver to every rank alike: the SUM of each rank's
    counts, and each rank's slot (its flag folded in) as the failure gather's rows."""
    world = len(kinds)
    layout = CountLayout(world, torch.float32)
    reduced = torch.zeros(layout.size(1))
    rows = []
    for r, kind in enumerate(kinds):
        slot, flag = _slot(r, kind)
        mine = torch.empty(layout.size(1))
        if kind != "silent":
            write_counts(mine, layout, r, [slot], [flag], None)
        else:
            mine.zero_()
        reduced += mine
        rows.append(slot[:NONFINITE] + [int(flag)] + slot[NONFINITE + 1:])
    return reduced, rows


def _judge(rank: int, kinds: list[str], raise_nonfinite: bool = True) -> tuple:
    """Rank ``rank``'s verdict on the exchange of ``kinds``: the error it raises (class, step,
    ranks, bucket, parameters, words) or what it passes with (optimizer step, events, figures)."""
    world = len(kinds)
    reduced, rows = _exchange(kinds)
    ledger = Ledger(world, ScalePolicy.from_config(SyncConfig()), rank=rank,
                    global_ranks=list(range(world)), raise_nonfinite=raise_nonfinite)
    averaged = torch.full((4,), float("nan") if "nonfinite" in kinds else 0.0)  # DDP's average
    record = BucketRecord(None, list(NAMES), 4, None, [averaged])
    counted = CountedStep(reduced, CountLayout(world, torch.float32), lambda: rows,
                          lambda replica_rows, active: None)
    try:
        applies = ledger.settle(STEP, [record], sync_ms=0.0, verify_started=0.0, counted=counted)
    except ConsistencyError as exc:
        return (type(exc).__name__, exc.step, exc.ranks, exc.bucket, exc.params, str(exc))
    return ("passed", applies, [e.to_json() for e in ledger.events], ledger.last["buckets"])


def _verdicts(kinds: list[str], raise_nonfinite: bool = True) -> list[tuple]:
    """Every rank's verdict on the same exchange, in rank order."""
    return [_judge(r, kinds, raise_nonfinite) for r in range(len(kinds))]


def _everywhere(kinds: list[str], raise_nonfinite: bool = True) -> tuple:
    verdicts = _verdicts(kinds, raise_nonfinite)
    assert all(v == verdicts[0] for v in verdicts), verdicts
    return verdicts[0]


KINDS = ["clean", "nonfinite", "ahead", "layout", "absent", "stopped", "bypassed", "replaced",
         "joined", "silent"]


@given(st.lists(st.sampled_from(KINDS), min_size=2, max_size=5), st.booleans())
def test_the_same_exchange_gives_the_same_verdict_on_every_rank(kinds, raise_nonfinite):
    first, *others = _verdicts(kinds, raise_nonfinite)
    assert all(v == first for v in others), (first, others)


@pytest.mark.parametrize("kinds,kind,ranks,params", [
    (["clean", "clean"], "passed", None, None),
    (["clean", "bypassed"], "GradientsNotAveraged", [1], NAMES),
    (["bypassed", "clean", "clean"], "GradientsNotAveraged", [0], NAMES),
    (["clean", "replaced"], "GradientsNotAveraged", [1], [NAMES[3]]),
    (["clean", "stopped"], "MissingGradient", [1], [NAMES[2]]),
    (["clean", "stopped", "bypassed"], "GradientsNotAveraged", [1, 2], NAMES),
    (["clean", "ahead"], "ClockMismatch", [0, 1], NAMES),  # no majority: both
    (["clean", "layout", "clean"], "BucketMisalignment", [1], NAMES),
    (["clean", "absent"], "MissingGradient", [1], [NAMES[1]]),
    (["clean", "nonfinite"], "NonFiniteGradient", [1], NAMES),
    (["clean", "silent"], "BucketMisalignment", [1], NAMES),
    (["clean", "joined", "ahead"], "ClockMismatch", [], NAMES),  # unnamed while one joined
])
def test_each_outcome_is_the_same_on_every_rank(kinds, kind, ranks, params):
    verdict = _everywhere(kinds)
    assert verdict[0] == kind, verdict
    if kind != "passed":
        assert verdict[1] == STEP and verdict[2] == ranks and verdict[4] == params, verdict
    else:
        assert verdict[1] is True and verdict[2] == []


def test_a_skipped_non_finite_step_is_skipped_on_every_rank_with_one_event():
    verdict = _everywhere(["nonfinite", "clean"], raise_nonfinite=False)
    assert verdict[:2] == ("passed", False)
    assert [(e["kind"], e["ranks"]) for e in verdict[2]] == [("NonFiniteGradient", [0])]


def test_the_rank_with_the_evidence_decides_the_words():
    bypass = _everywhere(["clean", "bypassed"])[5]
    assert "the forward ran through ddp.module" in bypass
    stopped = _everywhere(["clean", "stopped"])[5]
    assert "stopped before bucket 1" in stopped and f"{NAMES[2]} got no gradient" in stopped
    replaced = _everywhere(["replaced", "clean"])[5]
    assert "parameters were replaced after DDP wrapped them" in replaced


def test_ranks_that_failed_for_different_causes_are_each_named_with_their_cause():
    words = _everywhere(["stopped", "clean", "bypassed"])[5]
    assert "ranks [0, 2]" in words
    assert "ddp.module" in words.split(" (ranks [2])")[0]
    assert "stopped before bucket 1" in words and "(ranks [0])" in words
