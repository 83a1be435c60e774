"""Text 000's results of the fixes (§5, its 72-hour run): sync consistency, steadier allreduce
times, faster convergence, lower peak memory, fewer NCCL error lines.

Each compares the stock run with the fix on this record; a result whose baseline never failed
here, or whose evidence needs NCCL or per-run memory, says so instead of being judged.
"""

from __future__ import annotations

import math
import statistics

from openclaw_ref.reporting.claims.evidence import curve, multi_rank_sizes, paired, runs
from openclaw_ref.reporting.claims.judging import (
    CMD_NCCL8,
    HW_8GPU,
    NOTHING,
    Needs,
    cmd_cores,
    half_effect,
    judge_ratio,
    size_to_judge,
)
from openclaw_ref.reporting.claims.registry import JUDGED, TIMED, Family, Finding, Missing, Verdict
from openclaw_ref.reporting.record import RunRecord

FAMILY = Family()
claim = FAMILY.claim
RESULTS = "text 000 §5 (72-hour run)"


@claim("R1", "Gradient-sync consistency 99.9994% (target ≥ 99.999%)", source=RESULTS,
       outcomes=JUDGED)
def checks_pass_at_five_nines(rec: RunRecord) -> Finding:
    """Consistency = passed / run checks of hardened fp32 (clean runs). With 0 failures the
    95% bound on the failure rate is 3/n (rule of three): reproduced once 3/n ≤ 1e-5, else not
    measurable (too few checks, with the steps that would suffice); with failures, reproduced
    if the rate is ≤ 1e-5, else not reproduced."""
    hard = runs(rec, "hardened fp32")
    n = sum(r["summary"].get("sync", {}).get("checks_run", 0) for r in hard)
    passed = sum(r["summary"].get("sync", {}).get("checks_passed", 0) for r in hard)
    if not n:
        raise Missing("no hardened checks recorded")
    k = n - passed
    text = f"hardened checks passed {passed}/{n} ({100 * passed / n:.4f}%; text 000: 99.9994%)"
    ran = "hardened fp32, clean runs, every size"
    if k == 0 and 3 / n > 1e-5:
        steps = math.ceil(rec.config.get("steps", 40) * 3e5 / n / 100) * 100
        return Finding(Verdict.NOT_MEASURABLE, ran, text, f"insufficient checks: {n} < 300,000 "
                       "to bound failures below 1e-5", f"openclaw-bench compare --steps {steps}")
    return Finding(Verdict.REPRODUCED if k / n <= 1e-5 else Verdict.NOT_REPRODUCED, ran, text)


@claim("R2", "Per-step AllReduce time CV 0.023 (baseline 0.187)", source=RESULTS,
       outcomes=TIMED)
def hardened_steadies_step_times(rec: RunRecord) -> Finding:
    """Step-time CV of ddp / hardened fp32 (paired repeats, ranks ≤ cores/GPUs) against 4.57
    (half text 000's 0.187 / 0.023 = 8.1×), by bootstrap interval."""
    ran = "per-run step-time CV, ddp vs hardened fp32"
    w = size_to_judge(rec, multi_rank_sizes(rec), ran,
                      Needs(f"{HW_8GPU} or ≥ 8 cores", CMD_NCCL8))
    if isinstance(w, Finding):
        return w
    ddp, hard = paired(rec, "ddp", "hardened fp32", w, lambda r: r["summary"]["step_ms_cv"])
    if not ddp:
        raise Missing(f"no paired ddp / hardened runs at {w} ranks")
    if not any(sync_failed(r) for r in runs(rec, "ddp", w)):
        return Finding(Verdict.NOT_MEASURABLE, ran + f", {w} ranks",
                       f"ddp's CV {statistics.median(ddp):.3f}, hardened's "
                       f"{statistics.median(hard):.3f} (medians over repeats)",
                       "cannot be shown by this experiment: ddp never failed to sync here "
                       "(replicas equal, no event), so there is no failure for the fix to "
                       "steady, and the CV here is of the whole step, not of the allreduce; "
                       f"needs {HW_8GPU} where the baseline fails", CMD_NCCL8)
    label, reason, text = judge_ratio(ddp, hard, half_effect(0.187 / 0.023),
                                      "CV ratio ddp / hardened", cmd_cores(w))
    return Finding(label, ran + f", {w} ranks", text + " (text 000: 0.187 / 0.023)", reason)


def sync_failed(r: dict) -> bool:
    """A run whose sync visibly failed: replicas differ or a check fired."""
    return not r["summary"]["replicas_equal"] or bool(r.get("events"))


def steps_to(validation: list[dict], threshold: float) -> int | None:
    """The first validated step whose loss is below ``threshold``, if any."""
    return next((v["step"] for v in validation if v["loss"] < threshold), None)


@claim("R3", "Convergence 2.17× faster: val_loss < 0.86 after 1,842 steps", source=RESULTS,
       outcomes=JUDGED)
def hardened_converges_faster(rec: RunRecord) -> Finding:
    """Not measurable when ddp's curve synchronized correctly (replicas equal, no event): the
    fix has nothing to speed up. Otherwise reproduced if hardened reaches a quarter of ddp's
    first validation loss in ≤ 1/1.585 of ddp's steps (half text 000's 2.17×)."""
    d, h = curve(rec, "ddp"), curve(rec, "hardened fp32")
    dv, hv = d.get("validation") or [], h.get("validation") or []
    if not dv or not hv:
        raise Missing("validation curves not recorded")
    identical = d.get("loss") == h.get("loss")
    ran = "ddp vs hardened fp32 validation curves"
    if d["summary"]["replicas_equal"] and not d.get("events"):
        return Finding(Verdict.NOT_MEASURABLE, ran, "ddp's replicas stayed equal with no event"
                       + ("; the two loss curves are bitwise identical" if identical else ""),
                       f"no sync failure here for a fix to cure; needs {HW_8GPU}", CMD_NCCL8)
    threshold = 0.25 * dv[0]["loss"]
    sd, sh = steps_to(dv, threshold), steps_to(hv, threshold)
    sd_eff = sd if sd is not None else dv[-1]["step"] + 1
    ratio = sd_eff / sh if sh else 0.0
    return Finding(Verdict.REPRODUCED if ratio >= half_effect(2.17) else Verdict.NOT_REPRODUCED,
                   ran, f"to val loss < {threshold:.3f}: ddp {sd if sd is not None else 'never'}, "
                   f"hardened {sh if sh is not None else 'never'} steps ({ratio:.2f}×)")


@claim("R4", "Peak memory −19.3% (dynamic buckets hold fewer redundant buffers)",
       source=RESULTS, outcomes=JUDGED)
def fixes_lower_peak_memory(rec: RunRecord) -> Finding:
    """Needs peak memory per run (``summary.peak_memory_scope == "run"``: a fresh process or a
    reset high-water mark); ru_maxrss in a reused pool is per process. Cannot be shown when the
    saving to judge (9.65 % of ddp's peak) exceeds ddp's whole fp32 gradient bytes (what a
    bucket layout could save; a fixed size, so the verdict does not flip with noise). Else
    reproduced if the best hardened/bucketed variant peaks ≥ 9.65% (half text 000's 19.3%)
    below ddp."""
    sizes = multi_rank_sizes(rec)
    if not sizes:
        raise Missing("no multi-rank run")
    w = sizes[-1]
    scoped = [r for r in runs(rec, w=w) if r["summary"].get("peak_memory_scope") == "run"]
    ran = f"peak memory per rank on {w} ranks"
    if not scoped:
        raise Missing("summary.peak_memory_scope = 'run' (peak memory per run, not per "
                      "reused worker process)")

    def peak(v: str) -> float | None:
        vals = [max(r["summary"]["peak_memory_mb"]) for r in scoped if r["variant"] == v]
        return statistics.median(vals) if vals else None

    d = peak("ddp")
    others = {v: m for v in ("hardened fp32", "bucketed norm-ema-agreed")
              if (m := peak(v)) is not None}
    if d is None or not others:
        raise Missing("per-run peak memory of ddp and a fix variant")
    shown = "; ".join(f"{v} {m:.0f} MiB" for v, m in others.items()) + f"; ddp {d:.0f} MiB"
    grads = gradient_mib(scoped)
    needed = 0.193 / 2 * d
    if grads is not None and grads < needed:
        peaks = [max(r["summary"]["peak_memory_mb"]) for r in scoped]
        return Finding(Verdict.NOT_MEASURABLE, ran, f"{shown}; saving to judge ≥ {needed:.0f} "
                       f"MiB (half the claim's 19.3 % of ddp's peak); fp32 gradients "
                       f"{grads:.2f} MiB in all; run-to-run spread of the resident peak "
                       f"{max(peaks) - min(peaks):.0f} MiB",
                       "cannot be shown by this experiment: the saving to judge exceeds all the "
                       "gradient buffers a bucket layout could save; needs a model whose "
                       "gradients are a large share of the peak, on GPUs where the allocator "
                       "reports it "
                       f"({HW_8GPU})", CMD_NCCL8)
    ok = min(others.values()) <= (1 - 0.193 / 2) * d
    return Finding(Verdict.REPRODUCED if ok else Verdict.NOT_REPRODUCED, ran, shown)


def gradient_mib(chosen: list[dict]) -> float | None:
    """The fp32 gradient bytes ddp puts on the wire per step, in MiB (None: not recorded)."""
    wire = [r["costs"]["wire_bytes"] for r in chosen
            if r["variant"] == "ddp" and (r.get("costs") or {}).get("wire_bytes")]
    return max(wire) / 2**20 if wire else None


@claim("R5", "NCCL error log lines 42.7/hour → 0.3/hour", source=RESULTS,
       outcomes=(Verdict.NOT_MEASURABLE,))
def fixes_cut_nccl_error_lines(rec: RunRecord) -> Finding:
    """Never judged here: it needs a long NCCL run on GPUs with its log counted, which no
    experiment of this suite records, so no command here can move it."""
    return Finding(Verdict.NOT_MEASURABLE, "NCCL error log lines per hour, baseline vs fix",
                   f"backend {rec.environment.backend}: no NCCL log counted",
                   f"needs {HW_8GPU} for a long run with its NCCL log counted, which this suite "
                   "does not run", NOTHING)
