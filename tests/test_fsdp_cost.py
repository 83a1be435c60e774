"""The FSDP2 cost job (stock ``fully_shard`` and ``harden()`` on it, interleaved in one job), the
interleaving helpers it shares with the hook-cost job, and its table.

Figure arithmetic is checked on synthetic step times; one real 2-rank job (a few steps) shows
both arms are timed, end bitwise equal and raise nothing, and that its record renders; the same
on the (dp, tp) = (2, 2) mesh at 4 ranks (slow), whose hardened arm runs the guard's
tensor-parallel checks. Speed is never asserted here: it lives in
``benchmarks/benchmarks/bench_hooks.py`` and the published comparison.
"""

from __future__ import annotations

import pytest
from torch import nn

from openclaw_ref.experiments.fsdp_cost import (
    ARMS,
    BASELINE,
    HARDENED,
    FSDPCostConfig,
    cost_models,
    fsdp_cost_rank,
    job_figures,
    job_name,
    mesh_fits,
    summarize,
    tp_plan,
)
from openclaw_ref.experiments.hook_cost import mlp_loss, plain_mlp
from openclaw_ref.experiments.interleave import paired_figures, rotated
from openclaw_ref.reporting.fsdp_tables import fsdp_cost_table
from openclaw_ref.reporting.table import INSIDE_NOISE, ratio_cell
from openclaw_ref.sync.errors import BadInput


def _raw(stock: list[float], hardened: list[float], kinds: dict | None = None) -> dict:
    kinds = kinds or {}
    return {"arms": list(ARMS), "step_ms": {"fsdp": stock, "hardened-fsdp": hardened},
            "bitwise_equal": True, "exchanges": 7, "optimizer_steps": 7,
            "events": sum(kinds.values()), "event_kinds": kinds}


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


def test_the_table_has_one_row_per_mesh_so_the_2d_ratio_stands_beside_the_1d_one():
    stock = [200.0, 210.0, 190.0, 205.0, 195.0]
    one_d, two_d = FSDPCostConfig(world_size=4, steps=5, warmup=2), \
        FSDPCostConfig(world_size=4, tp=2, steps=5, warmup=2)
    jobs = {job_name(one_d): job_figures(one_d, _raw(stock, [x * 1.05 for x in stock])),
            job_name(two_d): job_figures(two_d, _raw(stock, [x * 1.1 for x in stock],
                                                     {"CanaryOff": 1}))}
    jobs[job_name(two_d)]["summary"] = dict(reversed(jobs[job_name(two_d)]["summary"].items()))
    t = fsdp_cost_table(jobs)  # (the record sorts its keys: stock need not come first)
    assert [r[:2] for r in t.rows] == [["1-D", "4"], ["(dp, tp) = (2, 2)", "4"]]
    assert [r[4] for r in t.rows] == ["1.050 [1.050, 1.050]", "1.100 [1.100, 1.100]"]
    assert [r[2] for r in t.rows] == ["200.00", "200.00"]
    assert [r[5:8] for r in t.rows] == [["yes", "7 / 7", "0"], ["yes", "7 / 7", "1 (CanaryOff 1)"]]
    assert "interleaved" in t.caption and "false alarm" in t.caption


def test_a_job_that_ended_apart_says_no_and_a_job_measured_under_load_shows_it():
    stock = [200.0] * 5
    job = {**job_figures(FSDPCostConfig(steps=5, warmup=2), {**_raw(stock, stock),
                                                             "bitwise_equal": False}),
           "load_average": [3.04, 11.5]}
    (row,) = fsdp_cost_table({"mlp-2r": job}).rows
    assert row[5] == "NO" and row[8] == "3.0 → 11.5"


def test_the_section_runs_1d_at_2_and_4_ranks_and_2d_at_4_and_quick_runs_the_first_only():
    from openclaw_ref.experiments.sections import fsdp_cost as section
    from openclaw_ref.experiments.settings import CompareConfig, quick_config

    assert section.meshes_of(CompareConfig()) == ((2, 1), (4, 1), (4, 2))
    assert section.meshes_of(quick_config()) == ((2, 1),)
    assert section.jobs(CompareConfig()) == 3


def test_each_job_has_its_own_key_in_the_record():
    assert [job_name(FSDPCostConfig(world_size=w, tp=tp)) for w, tp in ((2, 1), (4, 1), (4, 2))] \
        == ["mlp-2r", "mlp-4r", "mlp-4r-tp2"]


@pytest.mark.parametrize("kwargs, match", [
    ({"model": "tiny"}, "MLP only"),
    ({"world_size": 0}, "1 to 4"),
    ({"world_size": 8}, "1 to 4"),
    ({"steps": 4}, "at least 5"),
    ({"warmup": 1}, "at least 5"),
    ({"tp": 4, "world_size": 4}, "one of"),
    ({"tp": 2, "world_size": 2}, "at least 2 dp ranks"),
    ({"tp": 2, "world_size": 3}, "tp divides"),
])
def test_bad_fsdp_cost_settings_are_refused_before_any_rank_starts(kwargs, match):
    with pytest.raises(BadInput, match=match):
        FSDPCostConfig(**kwargs)


@pytest.mark.parametrize("world_size, tp, fits", [(1, 1, True), (4, 1, True), (4, 2, True),
                                                  (2, 2, False), (1, 2, False), (3, 2, False)])
def test_a_tp_mesh_needs_tp_to_divide_the_ranks_leaving_two_to_shard_over(world_size, tp, fits):
    assert mesh_fits(world_size, tp) is fits


def test_the_tp_plan_splits_alternate_pairs_of_linear_layers_and_leaves_the_others_out():
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    net = plain_mlp(0)  # Linear at 0, 2, ..., 14 (a ReLU after each)
    plan = tp_plan(net)
    assert {name: type(style) for name, style in plan.items()} == {
        "0": ColwiseParallel, "2": RowwiseParallel, "8": ColwiseParallel, "10": RowwiseParallel}
    assert all(isinstance(net[int(name)], nn.Linear) for name in plan)


def _job(pools, world_size: int, tp: int = 1, steps: int = 5, warmup: int = 2) -> dict:
    cfg = FSDPCostConfig(world_size=world_size, tp=tp, steps=steps, warmup=warmup)
    return job_figures(cfg, pools.get(world_size).run(fsdp_cost_rank, cfg, timeout_s=300)[0])


def _assert_well_formed(job: dict, steps: int, kinds: dict | None = None) -> None:
    assert set(job["summary"]) == set(ARMS)
    assert all(job["summary"][a]["median_step_ms"] > 0 for a in ARMS)
    assert job["bitwise_equal"] is True  # the guard left FSDP2's collectives as they were
    assert job["exchanges"] == job["optimizer_steps"] == steps  # one exchange per step
    assert job["event_kinds"] == (kinds or {}) and job["events"] == sum((kinds or {}).values())
    assert fsdp_cost_table({job_name(FSDPCostConfig(**job["config"])): job}
                           ).markdown().count("\n| ") == 2  # header + 1 job


def test_a_real_interleaved_fsdp2_job_on_two_ranks_gives_a_well_formed_record(pools):
    _assert_well_formed(_job(pools, 2), steps=7)


@pytest.mark.slow
@pytest.mark.parametrize("world_size", [1, 4])
def test_the_fsdp2_job_runs_on_one_and_four_ranks(pools, world_size):
    _assert_well_formed(_job(pools, world_size), steps=7)


@pytest.mark.slow
def test_a_real_job_on_the_dp_tp_mesh_ends_bitwise_equal_with_one_exchange_per_step(pools):
    """No false alarm; its one event is the canary saying, once, that it is off on TP."""
    _assert_well_formed(_job(pools, 4, tp=2), steps=7, kinds={"CanaryOff": 1})


def guard_on_the_tp_mesh(ctx) -> dict:
    """Rank task: the hardened arm of the (dp, tp) job, two steps; what its guard checks."""
    import torch

    from openclaw_ref.sync.hardening import harden

    models, data_rank = cost_models(FSDPCostConfig(world_size=4, tp=2), ctx)
    model, loss = models[HARDENED], mlp_loss(0, ctx, data_rank)
    guard, opt = harden(model, ctx=ctx), torch.optim.SGD(model.parameters(), lr=1e-3)
    try:
        for step in range(2):
            loss(model, step).backward()
            opt.step()
            opt.zero_grad()
        return {"summary": guard.summary(), "data_rank": data_rank}
    finally:
        guard.close()


@pytest.mark.slow
def test_the_tp_arm_runs_the_guards_tp_checks_so_its_cost_includes_them(pools):
    """The 2-D hardened arm compares the parameters replicated over tp (the four layers left
    out of the plan and the row-parallel biases) and the batch across the tp group each step:
    the figure prices those checks, not a guard that read the mesh as 1-D."""
    replies = pools.get(4).run(guard_on_the_tp_mesh, timeout_s=300)
    assert [r["data_rank"] for r in replies] == [0, 0, 1, 1]  # tp ranks of a dp group: 1 batch
    for r in replies:
        s = r["summary"]
        assert s["input_check"] == "on" and s["replica_checks"] == s["checks_run"] == 2
        assert {c["pattern"]: c["params"] for c in s["replicas"]} == {"dp:2=S": 8,
                                                                     "dp:2=S,tp:2=R": 2}
