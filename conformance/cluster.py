"""The cluster mode's driver (``openclaw-bench conform`` under torchrun): every selected check
on the live process group, in order, with identical results on every rank (so the job exits with
one code everywhere)."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence

from openclaw_ref.conformance.checks import (
    check_bucket_alignment,
    check_equivalence,
    check_fault_detection,
    check_overflow_rate,
    check_replica_consistency,
    check_shape_agreement,
)
from openclaw_ref.conformance.settings import CheckResult, ConformSettings
from openclaw_ref.core.launch import RankContext

CHECKS = ("shape-agreement", "bucket-alignment", "overflow-rate", "replica-consistency",
          "equivalence", "fault-detection")


def run_checks(ctx: RankContext, s: ConformSettings,
               checks: Sequence[str] = CHECKS) -> list[CheckResult]:
    """Every selected check on this live group, in order; identical results on every rank."""
    results: list[CheckResult] = []
    for name in checks:
        t0 = time.perf_counter()
        if name == "shape-agreement":
            got = [check_shape_agreement(ctx, s)]
        elif name == "bucket-alignment":
            got = [check_bucket_alignment(ctx, s)]
        elif name == "overflow-rate":
            # else the seed's 2^12 pre-scale: harden()'s per-bucket guard sends it
            fp16 = s.sync if s.sync.harden.wire == "fp16" or s.sync.name == "ddp-fp16" else \
                s.sync.replace(wire="fp16", scale="4096", guard="bucket")
            got = [check_overflow_rate(ctx, dataclasses.replace(s, sync=fp16))]
        elif name == "replica-consistency":
            got = [check_replica_consistency(ctx, s)]
        elif name == "equivalence":
            got = [check_equivalence(ctx, s)]
        elif name == "fault-detection":
            got = check_fault_detection(ctx, s)
        else:
            raise ValueError(f"unknown check {name!r}")
        for r in got:
            r.figures["wall_s"] = time.perf_counter() - t0
        results.extend(got)
    return results


def conform_rank(ctx: RankContext, s: ConformSettings, checks: Sequence[str]) -> list[dict]:
    """The cluster mode's task on one rank: every check, results as JSON (same on all ranks)."""
    return [r.to_json() for r in run_checks(ctx, s, checks)]
