"""Text 000's symptoms (§1): loss spikes, rank-dependent gradient norms, allreduce skew and its
link to the sparse path, shape disagreements, failures without a device synchronize, gradient
lifetimes.

Skew (C3) is timing, judged only at ranks ≤ cores/GPUs; gradient norms and shape counts (C2,
C5) are numbers, fair at any rank count. C7's quantity is undefined in text 000: never judged.
"""

from __future__ import annotations

import itertools
import statistics

from openclaw_ref.core.metrics import percentile
from openclaw_ref.reporting.claims.evidence import (
    curve,
    multi_rank_sizes,
    pct,
    repeat_values,
    runs,
    section,
)
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
from openclaw_ref.reporting.claims.registry import (
    JUDGED,
    TIMED,
    Family,
    Finding,
    Missing,
    Verdict,
    missing_field,
)
from openclaw_ref.reporting.record import RunRecord
from openclaw_ref.reporting.timeline import PER_BUCKET

FAMILY = Family()
claim = FAMILY.claim
SYMPTOMS = "text 000 §1"


def val_spikes(validation: list[dict], rise: float = 0.05) -> list[int]:
    """Steps where validation loss rose more than ``rise`` (relative) over the previous point."""
    return [cur["step"] for prev, cur in itertools.pairwise(validation)
            if cur["loss"] > prev["loss"] * (1 + rise)]


@claim("C1", "Validation-loss spikes recur every 37–42 steps", source=SYMPTOMS, outcomes=JUDGED)
def validation_spikes_are_periodic(rec: RunRecord) -> Finding:
    """Reproduced if ddp's validation rises (> 5%) recur at 37–42-step gaps (at least half of
    ≥ 2 gaps); not measurable if the validated span is shorter than 3 × 42 steps."""
    c = curve(rec, "ddp")
    val = c.get("validation") or []
    span = val[-1]["step"] - val[0]["step"] if len(val) > 1 else 0
    ran = f"ddp, {len(c.get('loss', []))} steps on {c.get('world_size')} ranks"
    if span < 3 * 42:
        return Finding(Verdict.NOT_MEASURABLE, ran, f"validated span {span} steps",
                       "curve too short for two 37–42-step gaps",
                       "openclaw-bench compare --curve-steps 300")
    spikes = val_spikes(val)
    gaps = [b - a for a, b in itertools.pairwise(spikes)]
    periodic = len(gaps) >= 2 and sum(37 <= g <= 42 for g in gaps) >= len(gaps) / 2
    return Finding(Verdict.REPRODUCED if periodic else Verdict.NOT_REPRODUCED, ran,
                   f"{len(spikes)} rises > 5% at steps {spikes[:8]}; gaps {gaps[:8]}")


@claim("C2", "Local grad L2 norm of layer.3.attn.v_proj.weight differs 217.4% between rank 0 "
       "and rank 7 (0.89 ± 0.32 vs 2.76 ± 0.81)", source=SYMPTOMS, outcomes=JUDGED)
def rank_gradient_norms_differ(rec: RunRecord) -> Finding:
    """Reproduced if rank 0's and the last rank's mean local gradient norm of
    layer.3.attn.v_proj.weight differ by ≥ 108.7% (half text 000's 217.4%), at the largest
    multi-rank ddp size (a numeric figure: no timing, so any rank count is fair)."""
    sizes = multi_rank_sizes(rec)
    if not sizes:
        raise Missing("no multi-rank run")
    w = sizes[-1]
    first, last = [], []
    for r in runs(rec, "ddp", w):
        for per_rank in (r.get("grad_norms") or {}).get("layer.3.attn.v_proj.weight", []):
            if per_rank[0] is not None and per_rank[-1] is not None:
                first.append(per_rank[0])
                last.append(per_rank[-1])
    if not first:
        raise Missing("no gradient norms of layer.3.attn.v_proj.weight recorded")
    m0, m1 = statistics.mean(first), statistics.mean(last)
    rel = abs(m1 - m0) / min(m0, m1)
    return Finding(Verdict.REPRODUCED if rel >= half_effect(3.174) - 1
                   else Verdict.NOT_REPRODUCED,
                   f"ddp on {w} ranks, local norms before sync, {len(first)} steps",
                   f"rank 0 {m0:.3f} ± {statistics.pstdev(first):.3f}, rank {w - 1} "
                   f"{m1:.3f} ± {statistics.pstdev(last):.3f}: {pct(rel)} apart")


def skew_p99(r: dict) -> float | None:
    """A run's p99 bucket skew: recorded per run (schema 3), or from its skews (1–2)."""
    if r.get("skew_p99_ms") is not None:
        return r["skew_p99_ms"]
    return percentile(r["skew_ms"], 99) if r.get("skew_ms") else None


@claim("C3", "The same 1.2 MB allreduce takes 1.83 ms on one rank and 4.91 ms on another: "
       "skew over a 3 ms threshold", source=SYMPTOMS,
       outcomes=TIMED)
def bucket_skew_exceeds_3ms(rec: RunRecord) -> Finding:
    """Reproduced if the per-bucket guard's (fp32) per-repeat p99 bucket skew is above 3 ms:
    bootstrap interval of median p99 / 3 ms entirely above 1 (below 1: not reproduced;
    containing 1: noise), and the C4 control on the same host shows the skew follows the
    sparse path; skew above 3 ms without that control, or with it showing the same skew with
    masking off, is not attributable here (the host's, not the sparse path's)."""
    ran = "hardened per-bucket fp32: bucket-ready times in the control block"
    w = size_to_judge(rec, multi_rank_sizes(rec), ran,
                      Needs(f"{HW_8GPU} or ≥ 8 cores", CMD_NCCL8))
    if isinstance(w, Finding):
        return w
    p99 = repeat_values(runs(rec, PER_BUCKET, w), skew_p99)
    if not p99:
        raise Missing(f"no skew recorded at {w} ranks")
    label, reason, text = judge_ratio(list(p99.values()), [3.0] * len(p99), 1.0,
                                      "p99 skew / 3 ms", cmd_cores(w))
    text += "; per-repeat p99 " + ", ".join(f"{v:.2f}" for v in p99.values()) + " ms"
    ran += f" on {w} ranks (≤ {rec.environment.capacity})"
    on, off = sparsity_arms(rec)
    if not on or not off:
        if label == Verdict.REPRODUCED:  # skew alone may be the host's: see the C4 control
            return Finding(Verdict.NOT_MEASURABLE, ran, text + "; no masking-off control "
                           "recorded", "not attributable without the C4 control",
                           cmd_cores(w))
        return Finding(label, ran, text + "; no masking-off control recorded", reason)
    text += (f"; C4 control: on {on['world_size']} ranks, {pct(on['share_over_3ms'])} of "
             f"bucket-steps above 3 ms with masking, {pct(off['share_over_3ms'])} with masking "
             "off")
    if label == Verdict.REPRODUCED and not skew_follows_masking(on, off):
        return Finding(Verdict.NOT_MEASURABLE, ran, text, "not attributable: the same skew "
                       "with masking off (C4 control), so it is this host's, not the sparse "
                       "path's", cmd_cores(w))
    return Finding(label, ran, text, reason)


SPARSE_ARM, MASKING_OFF_ARM = "sparse (text 000's range)", "masking off (s = 0)"


def sparsity_arms(rec: RunRecord) -> tuple[dict | None, dict | None]:
    """The C4 ablation's two arms (sparse path on, masking off); None where not recorded."""
    ab = (rec.section("ablations") or {}).get("sparsity") or {}
    return ab.get(SPARSE_ARM), ab.get(MASKING_OFF_ARM)


def skew_follows_masking(on: dict, off: dict) -> bool:
    """C4's causal test: the share above 3 ms drops ≥ 20 points with masking off."""
    return on["share_over_3ms"] - off["share_over_3ms"] >= 0.2


@claim("C4", "The skew appears in 89.3% of steps when the sparse path is active (n = 12,417)",
       source=SYMPTOMS, outcomes=JUDGED)
def skew_follows_sparse_path(rec: RunRecord) -> Finding:
    """Reproduced if ≥ 80% of bucket-steps exceed 3 ms skew with the sparse path active AND the
    share drops ≥ 20 points with masking off (the claim is causal); else not reproduced. Judged
    only when the ablation ran at ranks ≤ cores/GPUs."""
    section(rec, "ablations")  # Missing when the section did not run
    on, off = sparsity_arms(rec)
    if not on or not off:
        raise Missing("sparse-vs-masking-off ablation not recorded")
    w = on["world_size"]
    ran = f"hardened per-bucket fp32 on {w} ranks, sparse path on vs masking off"
    text = (f"{pct(on['share_over_3ms'])} of {on['bucket_steps']} bucket-steps above 3 ms with "
            f"text 000's masking vs {pct(off['share_over_3ms'])} with masking off "
            "(text 000: 89.3%)")
    fits = size_to_judge(rec, [w], ran, Needs(f"{HW_8GPU} or ≥ {w} cores", cmd_cores(w)), text)
    if isinstance(fits, Finding):
        return fits
    causal = on["share_over_3ms"] >= 0.8 and skew_follows_masking(on, off)
    return Finding(Verdict.REPRODUCED if causal else Verdict.NOT_REPRODUCED, ran, text,
                   "" if causal else "skew does not follow the sparse path")


@claim("C5", "Gradient shapes disagree across ranks in 14.7% of steps (ResNet-50: 0.2%)",
       source=SYMPTOMS, outcomes=(Verdict.REPRODUCED, Verdict.NOT_REPRODUCED, Verdict.REFUTED,
                                  Verdict.NOT_MEASURABLE))
def gradient_shapes_disagree_across_ranks(rec: RunRecord) -> Finding:
    """Counts steps whose bucket membership digests (names, shapes, dtypes) disagreed across
    ranks in hardened runs (≥ 2 ranks; a shape disagreement raises ShapeMismatch). Reproduced
    at ≥ 7.35% (half text 000's 14.7%); refuted when shapes never differ while the SET of
    parameters with a gradient does (ddp's presence manifests); else not reproduced."""
    hard = [r for r in runs(rec) + runs(rec, failed=True)
            if r["world_size"] >= 2 and r["variant"].startswith("hardened")]
    checked = sum(r["summary"].get("sync", {}).get("steps", 0) for r in hard if "error" not in r
                  and r["summary"].get("sync", {}).get("bucket_checks", 0) > 0)
    if not checked:
        raise Missing("no hardened run at ≥ 2 ranks verified bucket shapes")
    events = [e for r in hard for e in r.get("events", []) + [r.get("stopped_by") or {}]]
    shape_steps = sum(1 for e in events if e.get("kind") == "ShapeMismatch")  # one per step
    agree = [a for r in runs(rec, "ddp") if r["world_size"] >= 2
             for a in r.get("grad_presence_agrees", [])]
    presence = 1 - sum(agree) / len(agree) if agree else 0.0
    rate = shape_steps / checked
    text = (f"shape disagreements in {shape_steps} of {checked} verified steps ({pct(rate)}); "
            f"the set of parameters with a gradient differed in {pct(presence)} of "
            f"{len(agree)} ddp steps")
    if rate >= 0.147 / 2:
        label = Verdict.REPRODUCED
    elif shape_steps == 0 and presence > 0:
        label = Verdict.REFUTED
    else:
        label = Verdict.NOT_REPRODUCED
    return Finding(label, "hardened runs at ≥ 2 ranks (membership digest per bucket, every "
                   "step) and ddp's per-step presence manifests", text,
                   "what differs is gradient presence, not shape" if label == Verdict.REFUTED
                   else "")


def _collectives_without_synchronize(rec: RunRecord) -> str:
    """What the gloo comparison shows instead: crashed runs and steps with a collective."""
    try:
        steps = sum(len(r["step_ms"]) for r in runs(rec)
                    if r["world_size"] >= 2 and r["sync"]["name"] != "local")
        crashed = [r for r in runs(rec, failed=True) if not r.get("stopped_by")]
        return (f"{len(crashed)} crashed runs; {steps} steps with a collective (runs ≥ 2 "
                "ranks, local excluded), no device synchronize anywhere")
    except Missing as exc:
        return missing_field(str(exc))


@claim("C6", "AllReduce success 92.3% without torch.cuda.synchronize(), 99.998% with it",
       source=SYMPTOMS, outcomes=(Verdict.NOT_MEASURABLE,))
def allreduce_fails_without_cuda_synchronize(rec: RunRecord) -> Finding:
    """Never judged here: it needs CUDA streams under NCCL on several GPUs, and no experiment
    of this suite records allreduce failures with and without ``torch.cuda.synchronize()``, so
    no command here can move it. Shows what the comparison ran instead."""
    return Finding(Verdict.NOT_MEASURABLE, "every strategy run of the comparison",
                   _collectives_without_synchronize(rec),
                   f"needs {HW_8GPU} and a synchronize ablation this suite does not run",
                   NOTHING)


@claim("C7", "Gradient lifetime differs across ranks: 1.2 ms shortest, 7.9 ms longest",
       source=SYMPTOMS, outcomes=(Verdict.NOT_MEASURABLE,))
def gradient_lifetime_proxy(rec: RunRecord) -> Finding:
    """'Gradient lifetime' is undefined in text 000: never judged. Shows the closest figure
    (when each rank's buckets became ready after its step start) or says it is missing."""
    sizes = multi_rank_sizes(rec)
    w = sizes[-1] if sizes else None
    last = [b for r in runs(rec, PER_BUCKET, w) for b in r["sync_last"].get("buckets", [])]
    if w is None or not last:
        raise Missing("no multi-rank bucket timings")
    ready = [t for b in last for t in b["ready_ms"]]
    return Finding(Verdict.NOT_MEASURABLE, f"{PER_BUCKET} on {w} ranks",
                   f"proxy: bucket-ready times {min(ready):.1f}–{max(ready):.1f} ms after step "
                   "start (last step of each run)", "undefined quantity; proxy shown", NOTHING)
