"""Text 000's prevention measures (§5): refusing old NCCL, a skew barrier fed by a Prometheus
exporter, and a contract that sparse modules expose their mask entropy.

P1 needs NCCL on GPUs; P2's barrier is judged as a fix (does it make steps faster with text
000's jitter injected?), timing, so only at ranks ≤ cores/GPUs; P3 is an interface.
"""

from __future__ import annotations

import math
import statistics

from openclaw_ref.reporting.claims.evidence import curve, section
from openclaw_ref.reporting.claims.judging import (
    HW_8GPU,
    NOTHING,
    Needs,
    cmd_cores,
    judge_ratio,
    size_to_judge,
)
from openclaw_ref.reporting.claims.registry import (
    INTERFACE,
    TIMED,
    Family,
    Finding,
    Missing,
    Verdict,
    missing_field,
)
from openclaw_ref.reporting.record import RunRecord

FAMILY = Family()
claim = FAMILY.claim
PREVENTION = "text 000 §5"


@claim("P1", "Refuse NCCL older than 2.13.4 (2.12.x loses 12.7% of allreduces)",
       source=PREVENTION, outcomes=(Verdict.NOT_MEASURABLE,))
def old_nccl_loses_allreduces(rec: RunRecord) -> Finding:
    """Never judged here: the loss rate needs GPUs under NCCL 2.12.x and ≥ 2.13.4 side by side,
    which no experiment of this suite runs, so no command here can move it. The refusal itself
    is implemented (``doctor``, unit-tested) and the NCCL found is shown."""
    return Finding(Verdict.NOT_MEASURABLE, "doctor refuses NCCL < 2.13.4 (unit-tested)",
                   f"NCCL here: {rec.environment.nccl or 'none'}",
                   f"needs {HW_8GPU} under NCCL 2.12.x and ≥ 2.13.4, which this suite does not "
                   "run", NOTHING)


@claim("P2", "Prometheus exporter of allreduce time per rank/layer; barrier when its std "
       "exceeds 1.5 ms", source=PREVENTION,
       outcomes=TIMED)
def skew_barrier_speeds_steps(rec: RunRecord) -> Finding:
    """The barrier policy is reproduced as a fix if it makes steps faster with text 000's Δt
    jitter injected: interval of off / on step time (paired repeats) above 1; below 1 not
    reproduced; containing 1 inside the noise. Judged only at ranks ≤ cores/GPUs."""
    ab = section(rec, "ablations")
    rows = {r["arm"]: r for r in ab.get("skew_barrier", [])}
    reps = ab.get("skew_barrier_repeats") or {}
    if "on" not in rows or "off" not in rows:
        raise Missing("P2 barrier arms not recorded")
    w = rows["on"]["world_size"]
    ran = f"P2 barrier on vs off, {w} ranks, text 000's Δt jitter injected"
    shown = (f"median step {rows['off']['median_step_ms']:.1f} → "
             f"{rows['on']['median_step_ms']:.1f} ms; {rows['on']['barriers']} barriers in "
             f"{rows['on']['steps']} steps")
    fits = size_to_judge(rec, [w], ran, Needs(f"≥ {w} cores or GPUs", cmd_cores(w)), shown)
    if isinstance(fits, Finding):
        return fits
    off = [r["median_step_ms"] for r in reps.get("off", [])]
    on = [r["median_step_ms"] for r in reps.get("on", [])]
    n = min(len(off), len(on))
    label, reason, text = judge_ratio(off[:n], on[:n], 1.0, "speed-up (off / on step ms)")
    if not reps:
        reason = missing_field("ablations.skew_barrier_repeats (per-repeat arms)")
    return Finding(label, ran, f"{shown}; {text}", reason)


@claim("P3", "SparseGradientContract: sparse modules expose their mask entropy",
       source=PREVENTION,
       outcomes=INTERFACE)
def sparse_modules_expose_mask_entropy(rec: RunRecord) -> Finding:
    """Implemented if the model exposed a finite mask entropy in [0, 1] bit at every recorded
    step of the curve run; else not implemented."""
    c = curve(rec)
    bits = c.get("mask_entropy_bits")
    if bits is None:
        raise Missing("mask entropy not recorded")
    steps = len(c.get("loss") or bits)
    ok = len(bits) == steps and all(isinstance(b, (int, float)) and math.isfinite(b)
                                    and 0.0 <= b <= 1.0 for b in bits)
    return Finding(Verdict.IMPLEMENTED if ok else Verdict.NOT_IMPLEMENTED,
                   "SparseGatingUnit.sparse_mask_entropy(), read every step",
                   f"{len(bits)} values over {steps} steps"
                   + (f", mean {statistics.mean(bits):.3f} bits" if ok and bits else ""))
