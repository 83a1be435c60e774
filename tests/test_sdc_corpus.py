"""The compute canary names the rank whose hardware computes wrong gradients, within 2 K steps,
on every rank alike (with two ranks there is no majority: both are named); stock DDP and
``harden()`` without the canary are silent on the same faults (``experiments/sdc_corpus.py``)."""

from __future__ import annotations

import pytest

from openclaw_ref.core.faults import parse_fault
from openclaw_ref.core.sdc_faults import SDC_FAULTS
from openclaw_ref.experiments.sdc_corpus import Column, Outcome, SdcCase, corpus_task, rate_task
from openclaw_ref.sync.errors import BadInput

K = 2
PERSISTENT = ("sdc-ulp", "sdc-forward", "sdc-backward")
# every call faulty: the intermittent and data-dependent faults as persistent ones
ALWAYS = {"sdc-flip-low": "1", "sdc-flip-high": "1", "sdc-flip-exp": "1", "sdc-threshold": "0"}


def _cases(names, steps: int = 6) -> list[SdcCase]:
    return [SdcCase(n, ALWAYS.get(n), steps=steps, canary_every=K) for n in names]


def _same_on_every_rank(results: list[list[dict]]) -> list[dict]:
    keys = ("outcome", "kind", "step", "ranks", "params")
    for other in results[1:]:
        assert [[r[k] for k in keys] for r in other] == [[r[k] for k in keys]
                                                         for r in results[0]]
    return results[0]


def _not_named_in_time(rows: list[dict], world: int) -> list[dict]:
    """The rows the canary did not name correctly within 2 K steps of the fault
    (``ComputeMismatch``, a parameter, the last rank — or both ranks at two: no majority)."""
    suspects = [world - 1] if world > 2 else list(range(world))
    return [row for row in rows
            if not (row["outcome"] == Outcome.DETECTED and row["kind"] == "ComputeMismatch"
                    and row["ranks"] == suspects and row["params"]
                    and row["step"] <= row["case"]["fault_step"] + 2 * K)]


def test_the_canary_names_every_sdc_fault_on_two_ranks_within_2k_steps(pools):
    rows = _same_on_every_rank(pools.get(2).run(corpus_task, _cases(SDC_FAULTS), (Column.ON,)))
    assert not _not_named_in_time(rows, 2), rows


def test_the_canary_names_a_persistent_fault_on_four_ranks_as_the_outlier(pools):
    rows = _same_on_every_rank(pools.get(4).run(corpus_task, _cases(["sdc-ulp"]),
                                                (Column.ON,)))
    assert not _not_named_in_time(rows, 4), rows


@pytest.mark.slow
def test_the_canary_names_every_sdc_fault_on_four_ranks_within_2k_steps(pools):
    rows = _same_on_every_rank(pools.get(4).run(corpus_task, _cases(SDC_FAULTS), (Column.ON,)))
    assert not _not_named_in_time(rows, 4), rows


def test_the_canary_names_the_faulty_rank_under_the_composable_replicate(pools):
    case = SdcCase("sdc-ulp", steps=6, canary_every=K, replicate=True)
    rows = _same_on_every_rank(pools.get(2).run(corpus_task, [case], (Column.ON,)))
    assert not _not_named_in_time(rows, 2), rows


def test_the_canary_names_the_faulty_rank_when_the_verdict_waits_for_the_optimizer(pools):
    case = SdcCase("sdc-backward", steps=6, canary_every=K, verdict_at="optimizer-step")
    rows = _same_on_every_rank(pools.get(2).run(corpus_task, [case], (Column.ON,)))
    assert not _not_named_in_time(rows, 2), rows


def test_a_fault_present_at_start_up_is_named_at_the_first_probe(pools):
    """The ranks' fingerprints agree, so the canary compares bitwise from its first probe: a
    fault already there at step 0 persists over the re-runs and is named (no longer taken for
    heterogeneous ranks, as the start-up self-test this replaced did)."""
    ulp = SdcCase("sdc-ulp", steps=6, fault_step=0, canary_every=K)
    (named,) = _same_on_every_rank(pools.get(2).run(corpus_task, [ulp], (Column.ON,)))
    assert named["kind"] == "ComputeMismatch" and named["ranks"] == [0, 1]
    assert named["step"] == 1 and named["events"] == []


def test_stock_ddp_and_harden_without_the_canary_stay_silent_on_sdc(pools):
    rows = _same_on_every_rank(pools.get(2).run(corpus_task, _cases(SDC_FAULTS),
                                                (Column.STOCK, Column.OFF)))
    assert not [r for r in rows if r["outcome"] == Outcome.DETECTED], rows
    # a flipped exponent bit moves the weights: corruption nobody reports
    assert {r["outcome"] for r in rows if r["fault"] == "sdc-flip-high"} == {Outcome.SILENT}


def test_the_faulty_op_really_fired_on_the_faulty_rank_only(pools):
    results = pools.get(2).run(corpus_task, _cases(["sdc-backward"]), (Column.STOCK,))
    assert results[0][0]["fired"] == 0 and results[1][0]["fired"] > 0


def test_a_healthy_run_with_the_canary_raises_nothing(pools):
    rows = _same_on_every_rank(pools.get(2).run(corpus_task, [SdcCase(steps=8, canary_every=1)],
                                                (Column.ON,)))
    assert rows[0]["outcome"] == Outcome.NO_EFFECT and rows[0]["events"] == []


def test_an_intermittent_flip_is_reported_on_some_probes_and_never_the_wrong_rank(pools):
    """One probe per trial: a one-off is reported (an event naming rank 1), never raised alone
    (``test_canary_confirm.py`` drives the raise after the strikes)."""
    rates = pools.get(2).run(rate_task, "sdc-flip-high", "0.3", 6)
    assert {k: v for k, v in rates[0].items() if k != "fired"} == {
        k: v for k, v in rates[1].items() if k != "fired"}
    r = rates[0]
    assert 0 < r["named"] + r["reported"] == r["right_rank"] <= 6 and r["wrong_rank"] == 0


@pytest.mark.parametrize("text", ["sdc-ulp@1:3", "sdc-flip-low=0.5@0:2", "sdc-threshold=2.5"])
def test_sdc_faults_parse_like_every_fault(text):
    assert parse_fault(text).name in SDC_FAULTS


@pytest.mark.parametrize("text", ["sdc-flip-low=0", "sdc-flip-high=1.5", "sdc-ulp=3",
                                  "sdc-threshold=-1"])
def test_a_bad_sdc_value_is_refused_before_any_process_starts(text):
    with pytest.raises(BadInput):
        parse_fault(text)


@pytest.mark.slow
def test_the_cli_names_an_injected_sdc_fault_and_exits_3():
    from tests.helpers import run_cli

    got = run_cli("train", "--sync", "hardened", "--canary-every", "2", "--inject",
                  "sdc-ulp@1:2", "--world-size", "2", "--steps", "8", timeout=300)
    assert got.returncode == 3, got.stderr[-2000:]
    assert "ComputeMismatch at step 3, ranks [0, 1]" in got.stderr + got.stdout  # both of two
