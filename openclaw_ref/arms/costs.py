"""Exact per-step costs of every strategy: collectives, bytes on the wire, host syncs.

Timing differences between sync variants here are inside ±5% noise, so every comparison also
quotes these counts, derived from the layout the strategy actually uses (DDP's own logging
data for ``ddp``/``ddp-fp16``/``hardened``; the engine's frames for ``bucketed``): the step
guard (``hardened`` by default) issues DDP's collectives plus one small exchange per step; the
per-bucket guard carries its block at the tail of DDP's last bucket (no extra collective) — and
``recorded_collectives`` measures them with the profiler so a test can hold the two equal.

Definitions (per training step, per rank, steady state):
  ``collectives``   collectives issued by the sync (DDP with ``find_unused_parameters=True``
                    issues one extra allreduce of its int32 used-parameter map every step)
  ``wire_bytes``    payload bytes this rank contributes to those collectives (sum of input
                    sizes); a ring allreduce sends ``wire_bytes · 2(W−1)/W`` per rank
  ``host_syncs``    points where the strategy's own code waits for device values on the host
                    (``.tolist()``/``.item()``), counted as they would be on CUDA; DDP's
                    reducer-internal waits are not ours to count and are listed in ``notes``
  ``periodic``      extra collectives every ``replica_check_every`` steps (an
                    ``all_gather_object`` is two all_gathers: sizes, then payload); the
                    hardened guards have none (the replica digest rides in the step's block)
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from openclaw_ref.arms.strategy import SyncStrategy
from openclaw_ref.sync.base import Guard, Wire
from openclaw_ref.sync.ddp.step_setup import exchange_layout
from openclaw_ref.sync.evidence.control_counts import CountLayout
from openclaw_ref.sync.evidence.precision import WIRE_DTYPES

USED_MAP_BYTES = 4  # DDP's local_used_map is int32, one per parameter tensor


@dataclass(frozen=True)
class StepCost:
    strategy: str
    world_size: int
    collectives: int
    wire_bytes: int
    host_syncs: int
    periodic_collectives: int = 0  # every ``period`` steps
    period: int = 0
    notes: str = ""

    @property
    def ring_bytes_per_rank(self) -> float:
        return self.wire_bytes * 2 * (self.world_size - 1) / self.world_size

    def to_json(self) -> dict:
        return {**asdict(self), "ring_bytes_per_rank": self.ring_bytes_per_rank}


def _ddp_layout(ddp) -> tuple[list[int], int, bool]:
    """(gradient bytes per bucket, parameter tensors, find_unused_parameters) from DDP itself."""
    data = ddp._get_ddp_logging_data()
    sizes = [int(s) for s in str(data["bucket_sizes"]).split(",") if s.strip()]
    return sizes, int(data["num_parameter_tensors"]), bool(data["find_unused_parameters"])


def _element_size(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def step_cost(strategy: SyncStrategy, world_size: int) -> StepCost:
    """The per-step cost of a wrapped strategy (call after ``wrap``)."""
    name = strategy.name
    if name == "local":
        return StepCost(name, world_size, 0, 0, 0, notes="no synchronization")
    period = strategy.cfg.replica_check_every if name == "bucketed" else 0
    periodic = 2 if period else 0
    if name in ("ddp", "ddp-fp16", "hardened"):  # ddp-detail adds wrapper collectives: not modelled
        sizes, n_params, unused = _ddp_layout(strategy.ddp)
        used_map = (1, n_params * USED_MAP_BYTES) if unused else (0, 0)
        grad_elem = 4  # fp32 gradients
        if name == "hardened" and strategy.cfg.harden.guard is Guard.STEP:
            wire = 2 if strategy.cfg.harden.wire is Wire.FP16 else grad_elem
            block = exchange_layout(world_size).size(1)
            payload = sum(s // grad_elem * wire for s in sizes) + block * 4
            return StepCost(name, world_size, len(sizes) + used_map[0] + 1,
                            payload + used_map[1], 1,
                            notes=f"{len(sizes)} buckets on DDP's own path + used-map "
                                  f"allreduce + the step's exchange ({block} fp32 elements); "
                                  "1 host sync (the step check)")
        if name == "hardened":
            dtype = WIRE_DTYPES.get(strategy.cfg.harden.wire, torch.float32)  # native: fp32
            block = CountLayout(world_size, dtype).size(len(sizes))
            payload = (sum(s // grad_elem for s in sizes) + block) * _element_size(dtype)
            return StepCost(name, world_size, len(sizes) + used_map[0], payload + used_map[1],
                            1,
                            notes=f"{len(sizes)} buckets + used-map allreduce; the step's "
                                  f"control block ({block} elements) rides in the last bucket; "
                                  "1 host sync (the step check)")
        wire = 2 if name == "ddp-fp16" else grad_elem
        payload = sum(s // grad_elem * wire for s in sizes)
        return StepCost(name, world_size, len(sizes) + used_map[0], payload + used_map[1], 0,
                        notes=f"{len(sizes)} buckets + used-map allreduce; reducer-internal "
                              "waits not counted")
    if name == "bucketed":
        engine = strategy.engine
        # native: fp32
        wire = _element_size(WIRE_DTYPES.get(strategy.cfg.harden.wire, torch.float32))
        sizes = engine.wire_sizes()
        planner = engine.planner
        planner_syncs = int(planner.needs_local_norms) + int(planner.needs_synced_norms)
        return StepCost(name, world_size, len(sizes), sum(sizes) * wire, 1 + planner_syncs,
                        periodic, period,
                        notes=f"{len(sizes)} frames (presence counts ride in the last); "
                              f"planner {strategy.cfg.planner}: {planner_syncs} norm read(s)")
    raise ValueError(f"no cost model for strategy {name!r}")


def recorded_collectives(fn, *args) -> list[tuple[str, int]]:
    """Run ``fn(*args)`` under the profiler; the gloo/NCCL collectives it issued, as
    (op name, elements) in issue order — the measurement ``step_cost`` must agree with."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        fn(*args)
    out = []
    for e in prof.events():
        if e.name.startswith(("gloo:", "nccl:")):
            shapes = e.input_shapes or [[]]
            numel = sum(int(torch.Size(s).numel()) for s in shapes if s)
            out.append((e.name, numel))
    return out
