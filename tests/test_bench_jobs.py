"""Real benchmark jobs on the shared rank pools (2 ranks, tiny preset): a sync job's figures,
the raw allreduce, the DETAIL wrapper (and its mismatch check), and text 004's AMP case."""

from __future__ import annotations

import json
import math

import pytest
import torch

from openclaw_ref.arms.config import ArmConfig
from openclaw_ref.bench.figures import algbw_gbps, busbw_gbps, parameter_bytes
from openclaw_ref.bench.jobs import run_seed004_case, run_sync_case
from openclaw_ref.bench.rank_tasks import raw_allreduce_rank
from openclaw_ref.sync.errors import BadInput
from tests.helpers import TINY_BENCH


def test_a_sync_job_yields_every_figure_and_exposed_sync_is_step_minus_floor(pools):
    f = run_sync_case("ddp", 2, "gloo", TINY_BENCH, pool=pools.get(2))
    assert f["backend"] == "gloo" and f["replicas_equal"] and f["events"] == 0
    assert f["exposed_sync_ms"] == pytest.approx(f["median_step_ms"] - f["local_median_step_ms"])
    # the raw allreduce moves exactly the bytes the strategy puts on the wire per step
    assert f["raw_allreduce_bytes"] == f["wire_bytes_per_step"]
    assert f["wire_bytes_per_step"] >= parameter_bytes("tiny", "fp32")[1]
    if f["bytes_source"] == "costs":
        assert f["collectives_per_step"] >= 1 and f["host_syncs_per_step"] is not None
    assert f["raw_allreduce_ms"] > 0
    assert f["raw_busbw_gbps"] == pytest.approx(busbw_gbps(f["raw_algbw_gbps"], 2))
    assert f["raw_algbw_gbps"] == pytest.approx(
        algbw_gbps(f["raw_allreduce_bytes"], f["raw_allreduce_ms"] / 1e3))
    assert f["sync_over_raw"] == pytest.approx(f["exposed_sync_ms"] / f["raw_allreduce_ms"])
    assert all(m > 0 for m in f["peak_memory_mb_per_rank"]) and len(f["step_ms"][0]) == 3
    assert f["skew_p50_ms"] is None  # stock DDP exposes no per-bucket ready times
    json.dumps(f)  # the results command stores it as is


def test_raw_allreduce_sums_on_every_rank_and_reports_the_slowest_rank(pools):
    ms = pools.get(2).run(raw_allreduce_rank, 1000, "fp16", 3)
    assert ms[1] is None and len(ms[0]) == 3 and all(t > 0 for t in ms[0])


def detail_probe(ctx, mismatch: bool):
    """Rank task: build ddp-detail, run one step, optionally issue a mis-shaped collective."""
    import torch.distributed as dist
    import torch.nn.functional as F

    from openclaw_ref.arms.registry import make_strategy

    before = dist.get_debug_level()
    strategy = make_strategy(ArmConfig.of("ddp-detail"))
    model = torch.nn.Linear(4, 2)
    torch.manual_seed(0)
    ddp = strategy.wrap(model, ctx)
    wrapper = type(strategy.group._get_backend(torch.device("cpu"))).__name__
    x = torch.full((3, 4), float(ctx.rank + 1))
    F.mse_loss(ddp(x), torch.zeros(3, 2)).backward()
    grad = model.weight.grad.clone()
    error = None
    if mismatch:
        try:
            dist.all_reduce(torch.ones(1 + ctx.rank), group=strategy.group)
        except RuntimeError as exc:
            error = str(exc)
    strategy.close()
    return {"wrapper": wrapper, "grad": grad, "error": error,
            "level_restored": dist.get_debug_level() == before}


def test_ddp_detail_runs_gradient_buckets_through_the_detail_wrapper(pools):
    out = pools.get(2).run(detail_probe, False)
    assert all(o["wrapper"] == "_ProcessGroupWrapper" for o in out)
    torch.testing.assert_close(out[0]["grad"], out[1]["grad"])  # averaged, as DDP does
    assert all(o["level_restored"] for o in out)


def test_ddp_detail_wrapper_fires_on_a_collective_shape_mismatch_naming_the_ranks(pools):
    out = pools.get(2).run(detail_probe, True)
    for o in out:
        assert "Detected mismatch between collectives" in o["error"]
        assert "Rank 0" in o["error"] and "Rank 1" in o["error"]
        assert "TensorShape=[1]" in o["error"] and "TensorShape=[2]" in o["error"]


def test_amp_rejects_an_unknown_autocast_dtype():
    from openclaw_ref.core.train import TrainConfig

    with pytest.raises(BadInput, match="amp must be one of"):
        TrainConfig(amp="fp8").validate()


def test_seed004_amp_case_trains_one_rank_under_bf16_autocast_on_cpu(pools):
    if torch.cuda.is_available():
        pytest.skip("on a GPU machine the AMP case uses fp16 under NCCL")
    f = run_seed004_case("amp", 1, "gloo", TINY_BENCH, pool=pools.get(1))
    assert (f["amp_dtype"], f["strategy"]) == ("bf16", "local")
    assert math.isfinite(f["final_loss"]) and f["s_per_iter"] > 0 and f["peak_memory_mb"] > 0
