"""Hardened sync in the training loop: the same training as stock DDP, zero false alarms, the
same collectives per step, and the metrics the run JSON promises."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from openclaw_ref.arms.config import ArmConfig
from openclaw_ref.arms.costs import recorded_collectives, step_cost
from openclaw_ref.arms.registry import make_strategy
from openclaw_ref.core.data import DataConfig, SkillDataset, rank_batch
from openclaw_ref.core.model import build_model, preset
from openclaw_ref.sync.base import SyncConfig
from openclaw_ref.sync.evidence.control_counts import CountLayout
from tests.helpers import record_of, train_cfg

# Tolerances of the reduced-precision wires against fp32 (final loss after 10 SGD steps,
# relative). Each wire cast rounds an element to 2^-11 (fp16) / 2^-8 (bf16) relative; SGD's update
# is linear in the gradient, so the loss moves by about that fraction of the loss decrease:
# measured 2.2e-5 (fp16) and 9.0e-5 (bf16). The bounds leave ~10x headroom and still fail on any
# systematic error (a wrong scale or a missing division is off by >= 50%). AdamW is not used
# here: it normalizes tiny gradients, amplifying rounding to 5e-4 / 1.4e-2 after 10 steps.
WIRE_RTOL = {"fp16": 2e-4, "bf16": 1e-3}


def _rel(a: float, b: float) -> float:
    return abs(a - b) / abs(b)


# 4 ranks oversubscribe 2 cores (7 s): the slow profile (CI budget)
@pytest.mark.parametrize("world_size", [2, pytest.param(4, marks=pytest.mark.slow)])
def test_hardened_fp32_trains_exactly_like_ddp_and_one_process(pools, world_size):
    one = pools.get(1).run(record_of, train_cfg(1, ArmConfig.of("local")))[0]
    ddp = pools.get(world_size).run(record_of, train_cfg(world_size, ArmConfig.of("ddp")))[0]
    hard = pools.get(world_size).run(record_of, train_cfg(world_size, ArmConfig.of("hardened")))[0]
    final = hard["summary"]["final_loss"]
    assert _rel(final, ddp["summary"]["final_loss"]) <= 1e-5
    assert _rel(final, one["summary"]["final_loss"]) <= 1e-5
    assert hard["summary"]["replicas_equal"] and hard["events"] == []


@pytest.mark.parametrize("wire,guard", [("fp16", "step"), ("fp16", "bucket"),
                                        ("bf16", "bucket")])
def test_reduced_precision_wires_stay_within_their_stated_tolerance(pools, wire, guard):
    ddp = pools.get(2).run(record_of, train_cfg(2, ArmConfig.of("ddp"), optimizer="sgd"))[0]
    hard = pools.get(2).run(record_of, train_cfg(2, ArmConfig.of("hardened", wire=wire,
                                                               guard=guard),
                                            optimizer="sgd"))[0]
    assert _rel(hard["summary"]["final_loss"], ddp["summary"]["final_loss"]) <= WIRE_RTOL[wire]
    assert hard["summary"]["replicas_equal"] and hard["summary"]["skipped_steps"] == 0


def test_no_false_alarm_in_over_a_thousand_checked_bucket_steps(pools):
    """The per-bucket guard. Small buckets (32 per step), every wire, sparsity from none to
    extreme: missing expert gradients (zero-filled by DDP) must never look like a layout
    disagreement."""
    checked = missing = 0
    for wire, sparsity in [("fp16", (0.0, 0.0)), ("bf16", (0.12, 0.68)), ("fp32", (0.9, 0.95))]:
        sync = ArmConfig.of("hardened", wire=wire, scale="auto", bucket_cap_mb=0.01,
                          guard="bucket")
        rec = pools.get(2).run(record_of, train_cfg(2, sync, steps=12, sparsity_range=sparsity))[0]
        s = rec["summary"]["sync"]
        assert rec["events"] == [] and s["checks_run"] == s["checks_passed"]
        assert rec["summary"]["replicas_equal"]
        missing += sum(sum(st["missing_grads"]) for st in rec["steps"])
        checked += s["bucket_checks"]
    assert checked >= 1000
    assert missing > 0  # absent expert gradients were exercised, not avoided


def test_no_false_alarm_under_the_step_guard_from_no_to_extreme_sparsity(pools):
    """The default guard, both wires it sends: absent expert gradients (zero-filled by DDP)
    are never a missing gradient, and every step is checked."""
    missing = 0
    for wire, sparsity in [("fp16", (0.0, 0.0)), ("fp32", (0.12, 0.68)), ("fp32", (0.9, 0.95))]:
        sync = ArmConfig.of("hardened", wire=wire, bucket_cap_mb=0.01)
        rec = pools.get(2).run(record_of, train_cfg(2, sync, steps=12, sparsity_range=sparsity))[0]
        s = rec["summary"]["sync"]
        assert rec["events"] == [] and s["checks_run"] == s["checks_passed"]
        assert s["bucket_checks"] == 12 and rec["summary"]["replicas_equal"]
        missing += sum(sum(st["missing_grads"]) for st in rec["steps"])
    assert missing > 0  # absent expert gradients were exercised, not avoided


def test_every_step_reports_sync_time_skew_late_rank_overflow_scale_and_checks(pools):
    sync = ArmConfig.of("hardened", wire="fp16", scale="4096", guard="bucket")
    rec = pools.get(2).run(record_of, train_cfg(2, sync, steps=3))[0]
    m = rec["steps"][-1]["sync"]
    assert {"sync_ms", "buckets", "overflow_elements", "elements", "overflowed", "scale",
            "checks_run", "checks_passed"} <= set(m)
    assert m["scale"] == 4096.0 and m["elements"] > 0 and m["checks_run"] == len(m["buckets"])
    assert sum(b["elements"] for b in m["buckets"]) == m["elements"]
    b = m["buckets"][0]
    assert len(b["ready_ms"]) == 2 and b["late_rank"] in (0, 1)
    assert b["skew_ms"] == pytest.approx(max(b["ready_ms"]) - min(b["ready_ms"]))
    s = rec["summary"]["sync"]
    assert {"overflow_rate_elements", "overflow_rate_steps", "skipped_steps", "checks_run",
            "checks_passed", "max_skew_ms"} <= set(s)


def costs_and_recording(ctx, sync: SyncConfig) -> tuple[dict, list]:
    """Wrap with a strategy, warm up two steps, record the third: derived vs measured."""
    cfg = preset("tiny")
    ds = SkillDataset(cfg, DataConfig())
    model = build_model(cfg)
    strategy = make_strategy(sync)
    module = strategy.wrap(model, ctx)

    def step(i: int) -> None:
        strategy.begin_step(i)
        batch = rank_batch(ds, i, 8, ctx.rank, ctx.world_size)
        F.cross_entropy(module(batch.tokens, batch.sample_ids, i), batch.labels).backward()
        strategy.finish_step(i)
        for p in model.parameters():
            p.grad = None

    try:
        step(0)
        step(1)
        recorded = recorded_collectives(step, 2)
        return step_cost(strategy, ctx.world_size).to_json(), recorded
    finally:
        strategy.close()


@pytest.mark.parametrize("sync", [
    ArmConfig.of("ddp", bucket_cap_mb=0.05),
    ArmConfig.of("hardened", bucket_cap_mb=0.05),
    ArmConfig.of("hardened", bucket_cap_mb=0.05, guard="bucket"),
    ArmConfig.of("bucketed", bucket_cap_mb=0.05, planner="norm-ema-agreed"),
], ids=["ddp", "hardened", "hardened-bucket", "bucketed"])
def test_derived_per_step_costs_equal_the_recorded_collectives(pools, sync):
    cost, recorded = pools.get(2).run(costs_and_recording, sync)[0]
    assert cost["collectives"] == len(recorded)
    assert cost["wire_bytes"] == 4 * sum(n for _, n in recorded)  # fp32 wire, int32 used map


def test_the_step_guard_adds_one_small_exchange_to_ddps_collectives(pools):
    ddp, ddp_recorded = pools.get(2).run(costs_and_recording,
                                         ArmConfig.of("ddp", bucket_cap_mb=0.05))[0]
    hard, recorded = pools.get(2).run(costs_and_recording,
                                      ArmConfig.of("hardened", bucket_cap_mb=0.05, wire="fp16"))[0]
    assert hard["collectives"] == ddp["collectives"] + 1
    extra = sum(n for _, n in recorded) - sum(n for _, n in ddp_recorded)
    assert extra == CountLayout(2, torch.float32).size(1)  # the step's counts, once
    assert hard["wire_bytes"] < ddp["wire_bytes"]  # DDP's fp16 payload + the exchange


def test_the_bucket_guard_issues_exactly_as_many_collectives_per_step_as_ddp(pools):
    ddp, ddp_recorded = pools.get(2).run(costs_and_recording,
                                         ArmConfig.of("ddp", bucket_cap_mb=0.05))[0]
    hard, recorded = pools.get(2).run(costs_and_recording,
                                      ArmConfig.of("hardened", bucket_cap_mb=0.05, wire="fp16",
                                                 guard="bucket"))[0]
    assert hard["collectives"] == ddp["collectives"] > 2
    buckets = ddp["collectives"] - 1  # less DDP's used-map allreduce
    extra = sum(n for _, n in recorded) - sum(n for _, n in ddp_recorded)
    assert extra == CountLayout(2, torch.float16).size(buckets)  # the counted block, once
    assert hard["wire_bytes"] < ddp["wire_bytes"]  # fp16 payload + a few control elements


def test_cli_trains_with_the_hardened_fp16_auto_wire(tmp_path):
    from openclaw_ref.cli import main
    from openclaw_ref.core.jsonio import read_json

    out = tmp_path / "run.json"
    code = main(["train", "--sync", "hardened", "--guard", "bucket", "--wire", "fp16",
                 "--scale", "auto",
                 "--world-size", "2", "--steps", "3", "--global-batch", "8", "--no-progress",
                 "--eval-every", "0", "--out", str(out)])
    assert code == 0
    record = read_json(out)
    assert record["summary"]["sync"]["scale_mode"] == "auto"
    assert record["steps"][0]["sync"]["checks_passed"] >= 1


def test_a_fired_check_still_writes_the_run_json_with_its_event(pools, tmp_path):
    from openclaw_ref.core.errors import RankFailed
    from openclaw_ref.core.faults import parse_fault
    from openclaw_ref.core.jsonio import read_json

    out = tmp_path / "run.json"
    sync = ArmConfig.of("hardened", wire="fp16", guard="bucket")  # the guard that sees a scale
    scale_mismatch = (parse_fault("scale-mismatch=10@1:0"),)  # rank 1 pre-scales by 2^10
    with pytest.raises(RankFailed) as err:
        pools.get(2).run(record_of, train_cfg(2, sync, steps=3, out=str(out),
                                              faults=scale_mismatch))
    assert err.value.exit_code == 3
    events = read_json(out)["events"]
    assert events[0]["kind"] == "ScaleMismatch" and events[0]["ranks"] == [0, 1]  # no majority
    assert events[0]["step"] == 0 and events[0]["params"]

