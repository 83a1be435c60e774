"""The asv suite's ``Targets`` rows, computed from the figures of one run: reported, never
asserted. The step ratio is judged against ``STEP_RATIO_TARGET`` (``harden()`` ÷ stock DDP step
≤ 1.05×, the target where the per-step exchange is small: NCCL; on gloo the exchange alone
exceeds it, and the target there is ÷ the floor, ``reporting.speed``), which is measured with
the arms interleaved in one job (``experiments.hook_cost``); here the two steps come from
separate jobs, so the row only shows where a run stands. The other rows are reading aids with
their own thresholds (the check's overhead beside DETAIL's, sync beside the raw allreduce, fp16
beside fp32), not speed targets."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from openclaw_ref.reporting.speed import STEP_RATIO_TARGET


@dataclass
class TargetRow:
    target: str
    world_size: int
    value: float | None
    threshold: float
    met: bool | None  # None: not measurable here (a strategy missing, or the premise fails)
    note: str = ""


def targets(cases: Iterable[dict]) -> list[TargetRow]:
    """The rows of the figures of one run, per world size 2–8.

    Comparisons across jobs use *exposed* sync where they can: each is already corrected by
    the no-sync floor of its own job, so load drifting between jobs cancels. The step ratio is
    reported as defined (step ÷ step) with the floor-corrected ratio in its note."""
    by = {(c["strategy"], c["world_size"]): c for c in cases if c.get("kind") == "sync"}
    rows: list[TargetRow] = []
    for w in sorted({w for _, w in by if w >= 2}):
        ddp, hard = by.get(("ddp", w)), by.get(("hardened-fp32", w))
        detail = by.get(("ddp-detail", w))
        rows.append(_step_ratio_row(w, hard, ddp))
        if hard and ddp and detail:
            mine = hard["exposed_sync_ms"] - ddp["exposed_sync_ms"]
            theirs = detail["exposed_sync_ms"] - ddp["exposed_sync_ms"]
            if theirs > 0:
                value = mine / theirs
                rows.append(TargetRow("hardened check overhead / DETAIL's", w, value, 0.1,
                                      value <= 0.1, f"{mine:+.1f} ms vs {theirs:+.1f} ms"))
            else:
                rows.append(TargetRow("hardened check overhead / DETAIL's", w, None, 0.1, None,
                                      f"DETAIL measured no overhead ({theirs:+.1f} ms)"))
        else:
            rows.append(TargetRow("hardened check overhead / DETAIL's", w, None, 0.1, None,
                                  "needs ddp, hardened-fp32 and ddp-detail"))
        for label in ("hardened-fp32", "ddp"):
            c = by.get((label, w))
            value = c.get("sync_over_raw") if c else None
            rows.append(TargetRow(f"{label} exposed sync / raw allreduce", w, value, 1.2,
                                  None if value is None else value <= 1.2,
                                  "" if c else f"no {label} result"))
        for fp16, fp32 in (("hardened-fp16", "hardened-fp32"), ("ddp-fp16", "ddp")):
            rows.append(_fp16_row(w, by.get((fp16, w)), by.get((fp32, w)), fp16, fp32))
    return rows


def _step_ratio_row(w: int, hard: dict | None, ddp: dict | None) -> TargetRow:
    name = "hardened fp32 step / ddp step"
    if not (hard and ddp):
        return TargetRow(name, w, None, STEP_RATIO_TARGET, None, "a strategy has no result")
    value = hard["median_step_ms"] / ddp["median_step_ms"]
    floor = ddp["local_median_step_ms"]
    corrected = (floor + hard["exposed_sync_ms"]) / (floor + ddp["exposed_sync_ms"])
    return TargetRow(name, w, value, STEP_RATIO_TARGET, value <= STEP_RATIO_TARGET,
                     f"floor-corrected (ddp's floor + each exposed sync): {corrected:.3f}")


def _fp16_row(w: int, fp16: dict | None, fp32: dict | None, l16: str, l32: str) -> TargetRow:
    """fp16 wire ≤ 0.6 × fp32 sync time, where the link is bandwidth-bound: judged by the raw
    allreduce itself — half the bytes must take ≤ 0.6× the time, or the premise fails here."""
    name = f"{l16} sync / {l32} sync"
    if not (fp16 and fp32):
        return TargetRow(name, w, None, 0.6, None, "a strategy has no result")
    value = fp16["exposed_sync_ms"] / fp32["exposed_sync_ms"] if fp32["exposed_sync_ms"] > 0 \
        else None
    raw_ratio = fp16["raw_allreduce_ms"] / fp32["raw_allreduce_ms"]
    if raw_ratio > 0.6:
        return TargetRow(name, w, value, 0.6, None,
                         f"not bandwidth-bound: raw allreduce of half the bytes took "
                         f"{raw_ratio:.2f}× the time")
    return TargetRow(name, w, value, 0.6, None if value is None else value <= 0.6,
                     f"raw half-bytes ratio {raw_ratio:.2f}")
