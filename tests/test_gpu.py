"""The hardened hook on NCCL, one GPU per rank (``pytest -m gpu``; skipped without 2 GPUs).

What only a GPU job can show: the watchdog sees a hung NCCL collective (NCCL completes a
future at enqueue, so only ``Work.is_completed()`` can tell), ready times come from CUDA
events, and the fp16/fp32 wires agree with no-hook DDP on NCCL. The pytest parent never
initializes CUDA: the skip condition counts devices through NVML, and every tensor lives in
the spawned ranks.

Run on a machine with GPUs: ``pytest -m gpu tests/test_gpu.py``.
"""

from __future__ import annotations

import copy
import time

import pytest
import torch
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from openclaw_ref.core.errors import RankFailed
from openclaw_ref.core.launch import LaunchConfig, RankPool
from openclaw_ref.experiments.ddp_option_matrix import PlainNet, batch
from openclaw_ref.sync.base import SyncConfig
from openclaw_ref.sync.errors import SyncTimeout
from openclaw_ref.sync.hardened import harden


def _gpus() -> int:
    try:
        return torch.cuda.device_count()  # NVML where available: no CUDA context here
    except Exception:
        return 0


pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(_gpus() < 2, reason="needs 2 CUDA GPUs (NCCL, one per rank)")]


def nccl_parity_task(ctx, wire: str, steps: int = 4, stall_rank: int | None = None,
                     watchdog_s: float = 60.0, watchdog_action: str = "raise") -> dict:
    """Train the same PlainNet with no-hook DDP and with ``harden`` on NCCL; return the
    largest relative parameter difference, the events and the CUDA-event ready times."""
    torch.manual_seed(0)
    net = PlainNet().to(ctx.device)
    oracle = DDP(copy.deepcopy(net), device_ids=[ctx.device.index])
    hard = DDP(copy.deepcopy(net), device_ids=[ctx.device.index])
    state = harden(hard, SyncConfig(name="hardened", wire=wire, watchdog_s=watchdog_s,
                                    watchdog_action=watchdog_action), ctx)
    opts = [torch.optim.SGD(m.parameters(), lr=0.05) for m in (oracle, hard)]
    ready = []
    try:
        for step in range(steps):
            x, y = (t.to(ctx.device) for t in batch(step, 0, ctx.rank))
            for model, opt in zip((oracle, hard), opts):
                if model is hard and ctx.rank == stall_rank and step == 1:
                    time.sleep(3 * watchdog_s)  # the others wait inside an NCCL allreduce
                F.cross_entropy(model(x), y).backward()
                if model is oracle or state.finish_step():
                    opt.step()
                opt.zero_grad()
            ready.append(state.step_metrics().get("device_ready_ms"))
        worst = max(float(((a - b).abs().max() / b.abs().max().clamp_min(1e-12)).cpu())
                    for a, b in zip(hard.parameters(), oracle.parameters()))
        return {"rel": worst, "events": list(state.events), "ready": ready}
    finally:
        state.close()


def _run(wire: str, **kwargs) -> list[dict]:
    with RankPool(LaunchConfig(2, backend="nccl", timeout_s=120, pg_timeout_s=60)) as pool:
        return pool.run(nccl_parity_task, wire, **kwargs)


def test_hardened_fp32_matches_no_hook_ddp_on_nccl():
    result = _run("fp32")[0]
    assert result["rel"] <= 1e-6 and result["events"] == []


def test_the_fp16_wire_on_cuda_stays_inside_fp16_rounding_of_no_hook_ddp():
    result = _run("fp16")[0]
    assert result["rel"] <= 2.0 ** -10 and result["events"] == []


def test_ready_times_come_from_cuda_events_for_every_bucket():
    ready = _run("fp32")[0]["ready"]
    assert all(r and all(v >= 0.0 for v in r.values()) for r in ready)


def test_the_watchdog_names_a_rank_stalled_before_an_nccl_allreduce_with_exit_code_4():
    with pytest.raises(RankFailed) as err:
        _run("fp32", stall_rank=1, watchdog_s=2.0, watchdog_action="exit")
    assert isinstance(err.value.cause, SyncTimeout)
    assert err.value.cause.ranks == [1] and err.value.exit_code == 4
