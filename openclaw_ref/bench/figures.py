"""Every figure's arithmetic: bandwidths (nccl-tests' definitions), medians, percentiles and
rates of the strategies' own per-step metrics, and the bytes a case puts on the wire.

Medians exclude each run's first ``WARMUP_STEPS`` steps (the training loop's warm-up rule).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from openclaw_ref.bench.settings import WIRE_DTYPES
from openclaw_ref.core.metrics import percentile

WARMUP_STEPS = 2  # excluded from every median, as the training loop's summary does


def algbw_gbps(nbytes: int, seconds: float) -> float:
    """nccl-tests' algorithm bandwidth: bytes of the buffer ÷ time, in GB/s (10^9)."""
    return nbytes / seconds / 1e9


def busbw_gbps(algbw: float, world_size: int) -> float:
    """nccl-tests' allreduce bus bandwidth: algbw × 2(n−1)/n — what each link carries in a
    ring, comparable across world sizes (0 at one rank: nothing crosses a wire)."""
    return algbw * 2 * (world_size - 1) / world_size


def timed_steps(records: Sequence[dict]) -> list[float]:
    """Step times of every run after its warm-up steps (the training loop's own rule)."""
    return [s["step_ms"] for r in records for s in r["steps"][WARMUP_STEPS:]]


def sync_figures(steps: Sequence[dict], warmup: int = 2) -> dict:
    """Per-step strategy metrics (the run JSON's ``steps[i]["sync"]``) → medians and rates.
    A figure the strategy does not report is None (the asv track is then skipped)."""
    timed = [s.get("sync") or {} for s in steps[min(len(steps) - 1, warmup):]]
    skews = [b["skew_ms"] for m in timed for b in m.get("buckets", []) if "skew_ms" in b]
    sync_ms = [m["sync_ms"] for m in timed if m.get("sync_ms") is not None]
    verify_ms = [m["verify_ms"] for m in timed if m.get("verify_ms") is not None]
    elements = sum(m.get("elements", 0) for m in timed)
    overflowed = sum(m.get("overflow_elements", 0) for m in timed)
    has_overflow = any("overflow_elements" in m for m in timed)
    return {
        "sync_ms": statistics.median(sync_ms) if sync_ms else None,
        # seed R2 is about the allreduce time's CV: the strategy's own sync time, where reported
        "sync_ms_cv": statistics.pstdev(sync_ms) / statistics.mean(sync_ms)
        if len(sync_ms) > 1 and statistics.mean(sync_ms) > 0 else None,
        "verify_ms": statistics.median(verify_ms) if verify_ms else None,
        "skew_p50_ms": percentile(skews, 50) if skews else None,
        "skew_p99_ms": percentile(skews, 99) if skews else None,
        "overflow_rate": (overflowed / elements) if has_overflow and elements else None,
        "checks_run": sum(m.get("checks_run", 0) for m in timed)
        if any("checks_run" in m for m in timed) else None,
        "checks_passed": sum(m.get("checks_passed", 0) for m in timed)
        if any("checks_passed" in m for m in timed) else None,
    }


def parameter_bytes(preset_name: str, wire: str, seed: int = 1) -> tuple[int, int]:
    """(numel, bytes) of every trainable parameter in the wire dtype: what stock DDP with
    ``find_unused_parameters=True`` allreduces per step (every bucket, every step)."""
    from openclaw_ref.core.model import build_model, preset

    model = build_model(preset(preset_name, seed=seed))
    numel = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return numel, numel * WIRE_DTYPES[wire].itemsize


def costs_from_probe(probe: dict | None, preset_name: str, wire: str, seed: int) -> dict:
    """The cost columns of a case: the cost model's figures, or — without one — only the
    bytes, counted from the parameters (``bytes_source`` says which)."""
    if probe and "unavailable" not in probe:
        return {"collectives_per_step": probe["collectives"],
                "wire_bytes_per_step": probe["wire_bytes"],
                "host_syncs_per_step": probe["host_syncs"],
                "periodic_collectives": probe.get("periodic_collectives"),
                "cost_notes": probe.get("notes", ""), "bytes_source": "costs"}
    return {"collectives_per_step": None,
            "wire_bytes_per_step": parameter_bytes(preset_name, wire, seed)[1],
            "host_syncs_per_step": None, "periodic_collectives": None,
            "cost_notes": (probe or {}).get("unavailable", ""), "bytes_source": "parameters"}
