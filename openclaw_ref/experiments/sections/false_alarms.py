"""Section ``false_alarms``: the false-alarm corpus (``experiments.false_alarms``) published —
pattern × (stock DDP, hardened) → the measured outcome, at 2 ranks and at 4 where the comparison
runs 4. Each cell is a separate job on the same ranks; the reference arm of each pattern runs
first. A rank that dies (a watchdog that ends the process) makes the cell ``killed``."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from openclaw_ref.core.errors import LaunchTimeout, RankFailed
from openclaw_ref.core.pools import PoolCache
from openclaw_ref.experiments.false_alarms import (
    FAULTS,
    FP16_RELATIVE_LIMIT,
    OVERFLOW_AT,
    PAUSE_DEADLINE_S,
    PAUSE_S,
    RELATIVE_LIMIT,
    SPECS,
    Arm,
    Pattern,
    arm_task,
    hardened_config,
    judge,
    max_relative,
)
from openclaw_ref.sync.base import SyncConfig

if TYPE_CHECKING:
    from openclaw_ref.experiments.settings import CompareConfig, Progress

JOB_TIMEOUT_S = 120.0


def world_sizes(cfg: CompareConfig) -> list[int]:
    return sorted({w for w in cfg.world_sizes if 2 <= w <= 4}) or [2]


def jobs(cfg: CompareConfig) -> int:
    return len(world_sizes(cfg)) * len(Pattern) * len(Arm)


def _arm(pools: PoolCache, w: int, pattern: Pattern, arm: Arm) -> tuple[list[dict] | None,
                                                                          float]:
    t0 = time.perf_counter()
    try:
        replies = pools.get(w).run(arm_task, pattern, arm, timeout_s=JOB_TIMEOUT_S)
    except (RankFailed, LaunchTimeout):
        replies = None
    return replies, time.perf_counter() - t0


def _row(w: int, pattern: Pattern, arm: Arm, replies: list[dict] | None,
         reference: list[dict] | None, seconds: float) -> dict:
    errors = [r["error"] for r in replies or [] if r["error"] is not None]
    return {"world_size": w, "pattern": pattern.value, "arm": arm.value,
            "fault": pattern in FAULTS,
            "outcome": judge(pattern, replies, reference).value, "seconds": seconds,
            "max_relative": max_relative(replies, reference),
            "error": errors[0] if errors else None,
            "events": sorted({k for r in replies or [] for k in r["events"]})}


def run(cfg: CompareConfig, pools: PoolCache, progress: Progress) -> dict:
    rows = []
    for w in world_sizes(cfg):
        for pattern in Pattern:
            reference, ref_s = _arm(pools, w, pattern, Arm.REFERENCE)
            progress.tick(f"false alarms ×{w}: {pattern.name} reference")
            rows.append({"world_size": w, "pattern": pattern.value, "arm": Arm.REFERENCE.value,
                         "seconds": ref_s, "ran": reference is not None})
            for arm in (Arm.STOCK, Arm.HARDENED):
                replies, seconds = _arm(pools, w, pattern, arm)
                rows.append(_row(w, pattern, arm, replies, reference, seconds))
                progress.tick(f"false alarms ×{w}: {pattern.name} {arm.value}")
    pause = hardened_config(SPECS[Pattern.RANK0_PAUSE])
    return {"rows": rows,
            "settings": {"pause_s": PAUSE_S, "pause_deadline_s": PAUSE_DEADLINE_S,
                         "pause_action": pause.watchdog_action.value,
                         "default_deadline_s": SyncConfig().watchdog_s,
                         "overflow_at": OVERFLOW_AT, "relative_limit": RELATIVE_LIMIT,
                         "fp16_relative_limit": FP16_RELATIVE_LIMIT}}
