"""The tasks a job runs on every rank of its ``RankPool``.

They are top-level functions of an importable module on purpose: ``RankPool.run`` sends the
function to each spawned rank by pickle, i.e. by its module-qualified name, and the rank
imports it from here.
"""

from __future__ import annotations

import dataclasses
import time

import torch
import torch.distributed as dist

from openclaw_ref.bench.settings import WIRE_DTYPES
from openclaw_ref.core.launch import RankContext


def raw_allreduce_rank(ctx: RankContext, numel: int, wire: str, iters: int,
                       warmup: int = 2) -> list[float] | None:
    """Time ``iters`` flat allreduces of ``numel`` elements of the wire dtype. Each iteration
    starts after a barrier and counts until this rank holds the result; the slowest rank's
    time is the iteration's (gathered once at the end). Returns the per-iteration ms on rank 0."""
    x = torch.ones(numel, dtype=WIRE_DTYPES[wire], device=ctx.device)
    for _ in range(warmup):
        dist.all_reduce(x)
    times_ms = []
    for _ in range(iters):
        dist.barrier()
        _device_sync(ctx.device)
        t0 = time.perf_counter()
        dist.all_reduce(x)
        _device_sync(ctx.device)
        times_ms.append((time.perf_counter() - t0) * 1e3)
    slowest = torch.tensor(times_ms, dtype=torch.float64, device=ctx.device)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    return slowest.cpu().tolist() if ctx.is_main else None


def cost_probe_rank(ctx: RankContext, cfg) -> dict | None:
    """Exact per-step costs of ``cfg.sync`` from ``openclaw_ref.arms.costs.step_cost``,
    read off a live strategy after one training step (the layout DDP or the engine really uses).
    Returns rank 0's ``StepCost`` JSON; ``{"unavailable": why}`` when there is no cost model
    (checked on every rank alike, so no rank is left waiting in a collective)."""
    import torch.nn.functional as F

    from openclaw_ref.arms.registry import make_strategy
    from openclaw_ref.core.data import SkillDataset, rank_batch
    from openclaw_ref.core.model import build_model

    try:
        from openclaw_ref.arms.costs import step_cost
    except ImportError:
        return {"unavailable": "openclaw_ref.arms.costs is not installed"}
    model_cfg = cfg.model_config()
    ds = SkillDataset(model_cfg, dataclasses.replace(cfg.data, seed=cfg.seed))
    strategy = make_strategy(cfg.sync)
    module = strategy.wrap(build_model(model_cfg).to(ctx.device), ctx)
    try:
        batch = rank_batch(ds, 0, cfg.global_batch, ctx.rank, ctx.world_size).to(ctx.device)
        strategy.begin_step(0)
        F.cross_entropy(module(batch.tokens, batch.sample_ids, 0), batch.labels).backward()
        strategy.finish_step(0)
        try:
            cost = step_cost(strategy, ctx.world_size).to_json()
        except ValueError as exc:  # a strategy the cost model does not know
            cost = {"unavailable": str(exc)}
    finally:
        strategy.close()
    return cost if ctx.is_main else None


def _device_sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
