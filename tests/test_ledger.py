"""The step verdict (``Ledger.settle``) driven to each of its outcomes with synthetic reduced
buckets: no process group, the reduced blocks built exactly as the allreduce would leave them.

Outcomes: the step applies; a wire flag that fired on a finite sum overflow still applies (the
exact count is 0); a non-finite reduced wire skips the step and backs off an ``auto`` scale; a
rank's local NaN/inf is an event naming it (``skip``) or ``NonFiniteGradient`` (``raise``);
a disagreement raises, renumbered to global ranks.
"""

from __future__ import annotations

import pytest
import torch

from openclaw_ref.arms.blocks import BlockLedger, block_size, write_block
from openclaw_ref.sync.base import SyncConfig
from openclaw_ref.sync.errors import ClockMismatch, NonFiniteGradient
from openclaw_ref.sync.evidence.control_counts import CountLayout
from openclaw_ref.sync.evidence.control_counts_write import write_counts
from openclaw_ref.sync.evidence.control_layout import encode_slot, joined_slot
from openclaw_ref.sync.evidence.ledger import BucketRecord, CountedStep
from openclaw_ref.sync.evidence.precision import ScalePolicy


def reduced_block(world: int, *, clock: int = 4, ahead: int | None = None,
                  nonfinite: int | None = None) -> torch.Tensor:
    total = torch.zeros(block_size(world))
    for r in range(world):
        mine = torch.empty(block_size(world))
        write_block(mine, r, encode_slot(clock=clock + (r == ahead), bucket=0, digest=7,
                                         scale_exp=12, ready_s=1e-3 * r,
                                         nonfinite=r == nonfinite))
        total += mine
    return total


def record(block: torch.Tensor, reduced: torch.Tensor, flag: float | None = None) -> BucketRecord:
    return BucketRecord(0, ["w"], reduced.numel(), block, reduced,
                        flag=None if flag is None else torch.tensor(flag))


def ledger(nonfinite: str = "skip", world: int = 3, wire: str = "fp16") -> BlockLedger:
    sync = (SyncConfig(wire=wire, scale="auto") if wire == "fp16"
            else SyncConfig(wire=wire))
    policy = ScalePolicy.from_config(sync)
    return BlockLedger(world, policy, rank=0, global_ranks=[10, 11, 12][:world],
                  raise_nonfinite=nonfinite == "raise")


def settle(book: BlockLedger, rec: BucketRecord) -> bool:
    return book.settle(4, [rec], sync_ms=0.0, verify_started=0.0)


def test_a_clean_step_applies_and_counts_its_bucket_check():
    book = ledger()
    assert settle(book, record(reduced_block(3), torch.ones(8), flag=8.0)) is True
    assert book.last["checks_passed"] == book.last["checks_run"] == 1
    assert book.last["overflowed"] is False and book.events == []


def test_each_settled_bucket_reports_its_size_beside_its_ready_times():
    book = ledger()
    settle(book, record(reduced_block(3), torch.ones(8), flag=8.0))
    (bucket,) = book.last["buckets"]
    assert bucket["index"] == 0 and bucket["elements"] == 8 == book.last["elements"]
    assert len(bucket["ready_ms"]) == 3


def test_an_fp16_wire_reports_its_pre_scale():
    book = ledger()
    settle(book, record(reduced_block(3), torch.ones(8), flag=8.0))
    assert book.last["scale"] == 2.0 ** book.last["scale_exp"]


@pytest.mark.parametrize("wire", ["native", "bf16"])
def test_a_wire_without_a_pre_scale_reports_no_scale(wire):
    book = ledger(wire=wire)
    settle(book, record(reduced_block(3), torch.ones(8)))
    assert "scale" not in book.last and "scale_exp" not in book.last


def test_a_flag_from_a_finite_sum_that_overflowed_still_applies_the_step():
    book = ledger()
    reduced = torch.full((4,), 3e38)
    assert settle(book, record(reduced_block(3), reduced, flag=float("inf"))) is True
    assert book.last["overflow_elements"] == 0 and book.policy.backoffs == 0


def test_a_non_finite_reduced_wire_skips_the_step_and_backs_the_scale_off():
    book = ledger()
    reduced = torch.tensor([1.0, float("inf"), 2.0])
    exponent = book.policy.exponent
    assert settle(book, record(reduced_block(3), reduced, flag=float("inf"))) is False
    assert book.last["overflow_elements"] == 1 and book.policy.exponent == exponent - 1
    assert book.events == []  # a wire overflow names no rank: nobody's own values were bad


def test_a_local_nan_under_skip_is_an_event_naming_the_global_rank():
    book = ledger("skip")
    reduced = torch.tensor([float("nan"), 1.0])
    assert settle(book, record(reduced_block(3, nonfinite=2), reduced)) is False
    [event] = book.events
    assert event.kind == "NonFiniteGradient" and event.ranks == [12] and event.step == 4


def test_a_local_nan_under_raise_ends_the_run_naming_the_global_rank():
    with pytest.raises(NonFiniteGradient) as err:
        settle(ledger("raise"), record(reduced_block(3, nonfinite=1),
                                       torch.tensor([float("nan")])))
    assert err.value.ranks == [11]


def test_a_disagreement_raises_with_global_ranks():
    with pytest.raises(ClockMismatch) as err:
        settle(ledger(), record(reduced_block(3, ahead=2), torch.ones(2)))
    assert err.value.ranks == [12] and err.value.step == 4


def test_a_disagreement_in_a_later_bucket_names_its_global_rank():
    rows = torch.stack([reduced_block(3), reduced_block(3, ahead=1)])
    recs = [record(rows[0], torch.ones(2)), record(rows[1], torch.ones(2))]
    with pytest.raises(ClockMismatch) as err:
        ledger().settle(4, recs, sync_ms=0.0, verify_started=0.0)
    assert err.value.ranks == [11]


# --- the hardened hook's counted step block -------------------------------------------------


def counted_step(world: int, slots: list[list[int]], gathered: list[list[int]] | None = None):
    """The counted block of one bucket as the SUM leaves it, and its failure path: ``gather``
    hands back ``gathered`` (None: the test fails if the ledger gathers)."""
    layout = CountLayout(world, torch.float32)
    block = torch.zeros(layout.size(1))
    for r, s in enumerate(slots):
        mine = torch.empty(layout.size(1))
        write_counts(mine, layout, r, torch.tensor([s]))
        block += mine

    def gather() -> list[list[int]]:
        assert gathered is not None, "no gather expected"
        return gathered

    return CountedStep(block, layout, gather, lambda rows, active: None)


def _slot(clock: int = 4, nonfinite: bool = False) -> list[int]:
    return encode_slot(clock=clock, bucket=0, digest=7, scale_exp=12, ready_s=1e-3,
                       nonfinite=nonfinite)


def settle_counted(book: BlockLedger, step: CountedStep) -> bool:
    rec = BucketRecord(0, ["w"], 8, None, torch.ones(8))
    return book.settle(4, [rec], sync_ms=0.0, verify_started=0.0, counted=step)


def test_a_clean_counted_step_applies_without_a_gather():
    book = ledger()
    assert settle_counted(book, counted_step(3, [_slot()] * 3)) is True
    assert book.last["buckets"][0]["late_rank"] == 10


def test_a_failing_counted_step_gathers_the_slots_and_names_the_global_rank():
    slots = [_slot(), _slot(), _slot(clock=5)]
    with pytest.raises(ClockMismatch) as err:
        settle_counted(ledger(), counted_step(3, slots, gathered=slots))
    assert err.value.ranks == [12]


def test_with_a_joined_rank_a_disagreement_is_raised_by_kind_without_a_gather_or_ranks():
    slots = [_slot(), _slot(clock=5), joined_slot()]
    with pytest.raises(ClockMismatch) as err:
        settle_counted(ledger(), counted_step(3, slots))
    assert err.value.ranks == [] and "joined" in str(err.value)


def test_with_a_joined_rank_a_nan_still_skips_the_step_everywhere():
    book = ledger()
    slots = [_slot(), _slot(nonfinite=True), joined_slot()]
    assert settle_counted(book, counted_step(3, slots)) is True  # the reduced values are finite
    assert [e.kind for e in book.events] == ["NonFiniteGradient"] and book.events[0].ranks == []
