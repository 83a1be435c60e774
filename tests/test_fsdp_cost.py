"""The FSDP2 cost job (stock ``fully_shard`` and ``harden()`` on it, interleaved in one job), the
interleaving helpers it shares with the hook-cost job, and its table.

Figure arithmetic is checked on synthetic step times; one real 2-rank job (a few steps) shows
both arms are timed, end bitwise equal and raise nothing, and that its record renders. Speed is
never asserted here: it lives in ``benchmarks/benchmarks/bench_hooks.py`` and the published
comparison.
"""

from __future__ import annotations

import pytest

from openclaw_ref.experiments.fsdp_cost import (
    ARMS,
    BASELINE,
    FSDPCostConfig,
    fsdp_cost_rank,
    job_figures,
    summarize,
)
from openclaw_ref.experiments.interleave import paired_figures, rotated
from openclaw_ref.reporting.fsdp_tables import fsdp_cost_table
from openclaw_ref.reporting.table import INSIDE_NOISE, ratio_cell
from openclaw_ref.sync.errors import BadInput


def _raw(stock: list[float], hardened: list[float]) -> dict:
    return {"arms": list(ARMS), "step_ms": {"fsdp": stock, "hardened-fsdp": hardened},
            "bitwise_equal": True, "exchanges": 7, "optimizer_steps": 7, "events": 0}


def test_the_arms_take_turns_in_an_order_that_rotates_every_step():
    arms = ("a", "b", "c")
    assert [rotated(arms, s) for s in range(4)] == [
        ("a", "b", "c"), ("b", "c", "a"), ("c", "a", "b"), ("a", "b", "c")]


def test_paired_figures_are_the_median_per_step_ratio_so_a_shared_spike_cancels():
    base = [10.0, 10.0, 10.0, 40.0, 40.0]  # steps 3 and 4: the host was busy for both arms
    f = paired_figures([x * 1.02 for x in base], base)
    assert f["ratio"] == pytest.approx(1.02) and f["median_step_ms"] == pytest.approx(10.2)
    assert f["ratio_low"] == pytest.approx(1.02) and f["ratio_high"] == pytest.approx(1.02)


def test_the_summary_gives_each_arm_its_ratio_to_stock_fsdp():
    stock = [200.0, 210.0, 190.0, 205.0, 195.0]
    s = summarize(_raw(stock, [x * 1.05 for x in stock]))
    assert set(s) == set(ARMS)
    assert s[BASELINE]["ratio"] == 1.0
    assert s["hardened-fsdp"]["ratio"] == pytest.approx(1.05)


def test_the_job_record_keeps_the_settings_the_summary_and_the_correctness_beside_it():
    cfg = FSDPCostConfig(steps=5, warmup=2)
    stock = [200.0] * 5
    job = job_figures(cfg, _raw(stock, stock))
    assert job["config"]["world_size"] == 2 and job["config"]["steps"] == 5
    assert job["baseline"] == BASELINE and set(job["summary"]) == set(ARMS)
    assert (job["bitwise_equal"], job["exchanges"], job["optimizer_steps"], job["events"]) == \
        (True, 7, 7, 0)


@pytest.mark.parametrize("low, high, noisy", [(0.98, 1.04, True), (1.01, 1.09, False),
                                              (0.90, 0.99, False), (1.0, 1.0, True)])
def test_a_ratio_whose_interval_holds_one_is_called_inside_the_noise(low, high, noisy):
    cell = ratio_cell(1.0 if noisy else (low + high) / 2, low, high)
    assert cell.startswith(f"{1.0 if noisy else (low + high) / 2:.3f} [{low:.3f}, {high:.3f}]")
    assert (INSIDE_NOISE in cell) is noisy


def test_the_table_puts_stock_fsdp_first_and_the_correctness_in_its_caption():
    stock = [200.0, 210.0, 190.0, 205.0, 195.0]
    job = job_figures(FSDPCostConfig(steps=5, warmup=2),
                      _raw(stock, [x * 1.1 for x in stock]))
    job["summary"] = dict(reversed(job["summary"].items()))  # the record sorts its keys
    t = fsdp_cost_table("mlp", job)
    assert [r[0] for r in t.rows] == ["fsdp", "hardened-fsdp"]
    assert t.rows[0][2] == "1" and t.rows[1][2] == "1.100 [1.100, 1.100]"
    assert "interleaved" in t.caption and "bitwise equal between the arms at the end: yes" \
        in t.caption and "events (false alarms) 0" in t.caption


@pytest.mark.parametrize("kwargs, match", [
    ({"model": "tiny"}, "MLP only"),
    ({"world_size": 0}, "1 to 4"),
    ({"world_size": 8}, "1 to 4"),
    ({"steps": 4}, "at least 5"),
    ({"warmup": 1}, "at least 5"),
])
def test_bad_fsdp_cost_settings_are_refused_before_any_rank_starts(kwargs, match):
    with pytest.raises(BadInput, match=match):
        FSDPCostConfig(**kwargs)


def _job(pools, world_size: int, steps: int = 5, warmup: int = 2) -> dict:
    cfg = FSDPCostConfig(world_size=world_size, steps=steps, warmup=warmup)
    return job_figures(cfg, pools.get(world_size).run(fsdp_cost_rank, cfg)[0])


def _assert_well_formed(job: dict, steps: int) -> None:
    assert set(job["summary"]) == set(ARMS)
    assert all(job["summary"][a]["median_step_ms"] > 0 for a in ARMS)
    assert job["bitwise_equal"] is True  # the guard left FSDP2's collectives as they were
    assert job["exchanges"] == job["optimizer_steps"] == steps  # one exchange per step
    assert job["events"] == 0
    assert fsdp_cost_table("mlp", job).markdown().count("\n| ") == 3  # header + 2 arms


def test_a_real_interleaved_fsdp2_job_on_two_ranks_gives_a_well_formed_record(pools):
    _assert_well_formed(_job(pools, 2), steps=7)


@pytest.mark.slow
@pytest.mark.parametrize("world_size", [1, 4])
def test_the_fsdp2_job_runs_on_one_and_four_ranks(pools, world_size):
    _assert_well_formed(_job(pools, world_size), steps=7)
