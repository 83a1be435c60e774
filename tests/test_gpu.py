"""The hardened hook on CUDA (``pytest -m gpu``; ``tox -e gpu`` prints the outcome table).

What only a GPU job can show: ready times from CUDA events, the fp16/bf16 wires cast on the
device, the replica digest computed by CUDA kernels, and the watchdog seeing a collective
whose work is incomplete while its future is done (NCCL completes a future at enqueue, so only
``Work.is_completed()`` can tell). Most of it runs on ONE GPU: NCCL with one rank, or two ranks
sharing the GPU over gloo with CUDA tensors — what ``--backend nccl`` runs on a one-GPU machine
(NCCL refuses two ranks on one device; ``launch.resolve_backend``). Tests that need NCCL
between two devices keep their own skip. The pytest parent never initializes CUDA: the skip
conditions count devices through NVML, and every tensor lives in the spawned ranks.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from openclaw_ref.core.errors import RankFailed
from openclaw_ref.core.launch import LaunchConfig, RankPool
from openclaw_ref.experiments.ddp_option_matrix import PlainNet, batch
from openclaw_ref.experiments.hook_cost import bucket_count
from openclaw_ref.sync.base import SyncConfig
from openclaw_ref.sync.errors import SyncTimeout
from openclaw_ref.sync.hardening import harden


def _gpus() -> int:
    try:
        return torch.cuda.device_count()  # NVML where available: no CUDA context here
    except Exception:
        return 0


pytestmark = pytest.mark.gpu
one_gpu = pytest.mark.skipif(_gpus() < 1, reason="needs a CUDA GPU")
only_one_gpu = pytest.mark.skipif(
    _gpus() != 1, reason="needs exactly one CUDA GPU (two ranks share it over gloo only then)")
two_gpus = pytest.mark.skipif(_gpus() < 2, reason="needs 2 CUDA GPUs (NCCL, one per rank)")
SMALL_BUCKETS_MB = 0.001  # PlainNet in several buckets


@pytest.fixture(scope="module")
def nccl1():
    """One rank on NCCL (GPU 0)."""
    with RankPool(LaunchConfig(1, backend="nccl", timeout_s=120, pg_timeout_s=60)) as pool:
        yield pool


@pytest.fixture(scope="module")
def shared2():
    """Two ranks on the one GPU, gloo with CUDA tensors (``--backend nccl`` on one GPU)."""
    with RankPool(LaunchConfig(2, backend="nccl", timeout_s=120, pg_timeout_s=60)) as pool:
        yield pool


def _ddp(net, ctx, cap_mb: float = 25.0) -> DDP:
    ids = [ctx.device.index] if ctx.device.type == "cuda" else None
    return DDP(copy.deepcopy(net), device_ids=ids, bucket_cap_mb=cap_mb)


@dataclass(frozen=True)
class Parity:
    """One parity run (``RankPool.run`` passes arguments positionally: one picklable case)."""

    wire: str = "fp32"
    cap_mb: float = 25.0
    steps: int = 4
    stall_rank: int | None = None
    watchdog_s: float = 60.0
    watchdog_action: str = "raise"
    guard: str = "step"  # harden()'s default; "bucket" for the bf16 wire and per-bucket times


def parity_task(ctx, case: Parity) -> dict:
    """Train the same PlainNet with no-hook DDP and with ``harden``; return the largest relative
    parameter difference, the events, the CUDA-event ready times and where the rank ran."""
    torch.manual_seed(0)
    net = PlainNet().to(ctx.device)
    oracle, hard = _ddp(net, ctx, case.cap_mb), _ddp(net, ctx, case.cap_mb)
    state = harden(hard, SyncConfig(wire=case.wire, watchdog_s=case.watchdog_s,
                                    watchdog_action=case.watchdog_action, guard=case.guard),
                   ctx)
    opts = [torch.optim.SGD(m.parameters(), lr=0.05) for m in (oracle, hard)]
    ready = []
    try:
        for step in range(case.steps):
            x, y = (t.to(ctx.device) for t in batch(step, 0, ctx.rank))
            for model, opt in zip((oracle, hard), opts):
                if model is hard and ctx.rank == case.stall_rank and step == 1:
                    time.sleep(3 * case.watchdog_s)  # the others wait inside an NCCL allreduce
                F.cross_entropy(model(x), y).backward()
                if model is oracle or state.finish_step():
                    opt.step()
                opt.zero_grad()
            ready.append(state.step_metrics().get("device_ready_ms"))
        worst = max(float(((a - b).abs().max() / b.abs().max().clamp_min(1e-12)).detach().cpu())
                    for a, b in zip(hard.parameters(), oracle.parameters()))
        return {"rel": worst, "events": list(state.events), "ready": ready,
                "buckets": bucket_count(hard),
                "where": (ctx.backend, ctx.device.type)}
    finally:
        state.close()


def nonfinite_task(ctx) -> str:
    """A NaN in rank 0's input at step 1 under ``nonfinite="raise"``: the error's class."""
    net = PlainNet().to(ctx.device)
    hard = _ddp(net, ctx)
    state = harden(hard, SyncConfig(nonfinite="raise"), ctx)
    try:
        for step in range(3):
            x, y = (t.to(ctx.device) for t in batch(step, 0, ctx.rank))
            if step == 1 and ctx.rank == 0:
                x[0, 0, 0] = float("nan")
            try:
                F.cross_entropy(hard(x), y).backward()
                state.finish_step()
            except Exception as exc:
                return f"{type(exc).__name__} at step {step}"
        return "nothing raised"
    finally:
        state.close()


def digest_task(ctx) -> list[tuple[str, bool]]:
    """(dtype, CUDA digest == CPU digest of the same bytes) for tensors that span several
    digest rows and blocks, odd lengths and every dtype a parameter takes."""
    from openclaw_ref.sync.evidence.replica_digest import (
        DEVICE_BLOCK_WORDS,
        ROW_WORDS,
        ReplicaDigest,
    )

    g = torch.Generator().manual_seed(7)
    cpu = [torch.randn(3 * ROW_WORDS + 5, generator=g).to(d)
           for d in (torch.float32, torch.float16, torch.bfloat16, torch.float64)]
    cpu.append(torch.randint(-2**40, 2**40, (1001,), generator=g))
    cpu.append(torch.randn(DEVICE_BLOCK_WORDS + 3, generator=g, dtype=torch.float64))
    on_cpu = ReplicaDigest().digests(cpu)
    on_gpu = ReplicaDigest().digests([t.to(ctx.device) for t in cpu]).cpu()
    return [(str(t.dtype), bool(a == b)) for t, a, b in zip(cpu, on_cpu, on_gpu)]


def sync_free_backward_task(ctx) -> dict:
    """``harden()`` with its defaults (CUDA: the verdict read at the optimizer step), every
    backward after a warm-up step run under ``torch.cuda.set_sync_debug_mode("error")``, which
    raises on any synchronizing CUDA call: the hook, its control block, the replica digest
    and DDP's finalize must all stay stream-ordered. A NaN at the last step must still be
    raised, from the optimizer step, before it applies anything."""
    net = PlainNet().to(ctx.device)
    hard = _ddp(net, ctx, SMALL_BUCKETS_MB)
    state = harden(hard, SyncConfig(nonfinite="raise"), ctx)
    opt = torch.optim.SGD(hard.parameters(), lr=0.05)
    out = {"deferred": state.deferred, "error": None}
    try:
        for step in range(20):  # more than the K = 16 replica slices: every slice digested
            x, y = (t.to(ctx.device) for t in batch(step, 0, ctx.rank))
            if step == 19:
                x[0, 0, 0] = float("nan")
            loss = F.cross_entropy(hard(x), y)
            torch.cuda.set_sync_debug_mode("error" if step else "default")
            try:
                loss.backward()
            finally:
                torch.cuda.set_sync_debug_mode("default")
            before = [p.detach().clone() for p in hard.parameters()]
            try:
                opt.step()
            except Exception as exc:
                out["error"] = f"{type(exc).__name__} at step {step}"
                out["unchanged"] = all(torch.equal(a, p) for a, p in zip(before,
                                                                         hard.parameters()))
                break
            opt.zero_grad()
        out["steps"] = state.summary()["steps"]
        return out
    finally:
        state.close()


def replica_task(ctx, perturb_rank: int | None) -> str:
    """``replica_check`` over the group; ``perturb_rank`` changes one element of one parameter."""
    from openclaw_ref.sync.evidence.checks import replica_check

    torch.manual_seed(0)
    net = PlainNet().to(ctx.device)
    with torch.no_grad():
        if ctx.rank == perturb_rank:
            net.head.bias[0] += 1e-3
    try:
        replica_check(net.named_parameters(), step=5)
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return "agree"


def _sleep_cycles(seconds: float) -> int:
    """GPU clock cycles that ``torch.cuda._sleep`` spins for ``seconds`` (measured here)."""
    probe = 10**7
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(probe)
    end.record()
    end.synchronize()
    return int(probe * seconds * 1e3 / start.elapsed_time(end))


def stalled_collective_task(ctx, stall_s: float, watchdog_s: float) -> list[dict]:
    """Step 1's backward queued behind a ``stall_s`` GPU spin: its allreduces are issued (their
    futures done at enqueue) but their work cannot complete. The watchdog's events."""
    net = PlainNet().to(ctx.device)
    hard = _ddp(net, ctx)
    state = harden(hard, SyncConfig(watchdog_s=watchdog_s,
                                    watchdog_action="report"), ctx)
    try:
        for step in range(2):
            state.begin_step(step)
            x, y = (t.to(ctx.device) for t in batch(step, 0, ctx.rank))
            loss = F.cross_entropy(hard(x), y)
            if step == 1 and stall_s > 0:
                torch.cuda._sleep(_sleep_cycles(stall_s))
            loss.backward()
            state.finish_step()
        return [e.to_json() for e in state.events]
    finally:
        state.close()


# one GPU ----------------------------------------------------------------------------------
@one_gpu
def test_hardened_fp32_matches_no_hook_ddp_on_one_nccl_rank(nccl1):
    result = nccl1.run(parity_task, Parity())[0]
    assert result["where"] == ("nccl", "cuda")
    assert result["rel"] <= 1e-6 and result["events"] == []


@one_gpu
def test_the_fp16_wire_cast_on_the_gpu_stays_inside_fp16_rounding(nccl1):
    result = nccl1.run(parity_task, Parity("fp16"))[0]
    assert result["rel"] <= 2.0 ** -10 and result["events"] == []


@one_gpu
def test_the_bf16_wire_cast_on_the_gpu_stays_inside_bf16_rounding(nccl1):
    result = nccl1.run(parity_task, Parity("bf16", guard="bucket"))[0]
    assert result["rel"] <= 2.0 ** -6 and result["events"] == []  # CPU gloo: 0.0074


@one_gpu
def test_ready_times_come_from_cuda_events_for_every_bucket(nccl1):
    result = nccl1.run(parity_task, Parity(cap_mb=SMALL_BUCKETS_MB, guard="bucket"))[0]
    assert result["buckets"] >= 2
    for ready in result["ready"]:
        assert ready is not None and len(ready) == result["buckets"]
        assert all(v >= 0.0 for v in ready.values())


@one_gpu
def test_the_step_guards_ready_time_comes_from_a_cuda_event_every_step(nccl1):
    result = nccl1.run(parity_task, Parity(cap_mb=SMALL_BUCKETS_MB))[0]
    for ready in result["ready"]:
        assert ready is not None and list(ready) == ["step"] and ready["step"] >= 0.0


@one_gpu
def test_a_nan_gradient_is_caught_by_the_device_side_check(nccl1):
    assert nccl1.run(nonfinite_task)[0] == "NonFiniteGradient at step 1"


@one_gpu
def test_no_backward_synchronizes_the_host_and_an_error_still_stops_the_optimizer(nccl1):
    out = nccl1.run(sync_free_backward_task)[0]
    assert out["deferred"] is True
    assert out["error"] == "NonFiniteGradient at step 19" and out["unchanged"], out


@one_gpu
def test_the_cuda_replica_digest_equals_the_cpu_digest_of_the_same_bytes(nccl1):
    rows = nccl1.run(digest_task)[0]
    assert len(rows) == 6 and all(equal for _, equal in rows), rows


@one_gpu
def test_the_watchdog_sees_an_allreduce_whose_work_waits_behind_a_gpu_stall(nccl1):
    events = nccl1.run(stalled_collective_task, 6.0, 1.0)[0]
    timeouts = [e for e in events if e["kind"] == "SyncTimeout"]
    assert timeouts and timeouts[0]["step"] == 1 and timeouts[0]["ranks"] == []
    assert "the collective itself is slow" in timeouts[0]["detail"]


@one_gpu
def test_the_watchdog_stays_quiet_without_a_stall(nccl1):
    assert nccl1.run(stalled_collective_task, 0.0, 1.0)[0] == []


@only_one_gpu
def test_two_ranks_sharing_one_gpu_over_gloo_match_no_hook_ddp(shared2):
    result = shared2.run(parity_task, Parity(cap_mb=SMALL_BUCKETS_MB))[0]
    assert result["where"] == ("gloo", "cuda")
    assert result["rel"] <= 1e-6 and result["events"] == []


@only_one_gpu
def test_two_ranks_sharing_one_gpu_agree_in_the_replica_check(shared2):
    assert shared2.run(replica_task, None) == ["agree", "agree"]


@only_one_gpu
def test_the_replica_check_names_the_rank_whose_cuda_parameter_diverged(shared2):
    verdict = shared2.run(replica_task, 1)[0]
    assert verdict.startswith("ReplicaDivergence") and "ranks [1]" in verdict
    assert "head.bias" in verdict


# two GPUs ---------------------------------------------------------------------------------
def _run2(case: Parity) -> list[dict]:
    with RankPool(LaunchConfig(2, backend="nccl", timeout_s=120, pg_timeout_s=60)) as pool:
        return pool.run(parity_task, case)


@two_gpus
def test_hardened_fp32_matches_no_hook_ddp_on_nccl():
    result = _run2(Parity())[0]
    assert result["rel"] <= 1e-6 and result["events"] == []


@two_gpus
def test_the_fp16_wire_on_cuda_stays_inside_fp16_rounding_of_no_hook_ddp():
    result = _run2(Parity("fp16"))[0]
    assert result["rel"] <= 2.0 ** -10 and result["events"] == []


@two_gpus
def test_the_watchdog_names_a_rank_stalled_before_an_nccl_allreduce_with_exit_code_4():
    with pytest.raises(RankFailed) as err:
        _run2(Parity(stall_rank=1, watchdog_s=2.0, watchdog_action="exit"))
    assert isinstance(err.value.cause, SyncTimeout)
    assert err.value.cause.ranks == [1] and err.value.exit_code == 4
