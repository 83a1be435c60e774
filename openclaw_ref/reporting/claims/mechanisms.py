"""Text 000's causes (§2): a late rank shifting bucket boundaries, gradient entropy, buckets that
differ per rank, and rank-dependent FP16 pre-scales.

Each is judged from the fault matrix or the overflow section (counts, not timing), so any rank
count is fair, except where text 000 names one (M4's 8-rank FP16 sum). M2's entropy is of an
unspecified distribution: never judged.
"""

from __future__ import annotations

import statistics

from openclaw_ref.reporting.claims.evidence import as_ms, curve, fault_cases, pct, section
from openclaw_ref.reporting.claims.judging import CMD_FAULTS, CMD_OVERFLOW, NOTHING
from openclaw_ref.reporting.claims.registry import Family, Finding, Missing, Verdict
from openclaw_ref.reporting.record import RunRecord

FAMILY = Family()
claim = FAMILY.claim
CMD_TREE = ("NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=COLL,TUNING openclaw-bench conform --backend nccl "
            "--world-size 8 --sync ddp --faults late-rank=2.2ms")
ALL_FOUR = (Verdict.REPRODUCED, Verdict.NOT_REPRODUCED, Verdict.REFUTED, Verdict.NOT_MEASURABLE)


@claim("M1", "A per-rank mask delay Δt ∈ [0.3, 5.7] ms lets a ring member run ahead and "
       "shifts bucket boundaries; above 2.1 ms NCCL falls back from ring to tree",
       source="text 000 §2.1", outcomes=ALL_FOUR)
def late_rank_shifts_bucket_boundaries(rec: RunRecord) -> Finding:
    """Reproduced if a late rank shifts bucket boundaries (a BucketMisalignment in any
    late-rank case); refuted if none does with Δt ≥ 5.7 ms (covering text 000's range); not
    reproduced if none does with a smaller Δt. The ring→tree half needs NCCL."""
    faults = section(rec, "faults")
    late = [c for c in faults.get("cases", []) if c.get("fault_name") == "late-rank"]
    if not late:
        raise Missing("late-rank not in the fault matrix")
    shifted = [c for c in late
               if "Misalignment" in (c.get("kind") or "") + (c.get("detail") or "")]
    value = (faults.get("settings") or {}).get("late_rank_value", "?")
    dt = as_ms(value)
    tree = ("ring→tree half: not measurable here: needs NCCL on GPUs, run "
            f"`{CMD_TREE}`" if rec.environment.backend != "nccl" else
            "ring→tree half: evidence missing: NCCL's chosen algorithm not recorded")
    if shifted:
        label = Verdict.REPRODUCED
    elif dt is not None and dt >= 5.7:
        label = Verdict.REFUTED
    else:
        label = Verdict.NOT_REPRODUCED
    return Finding(label, f"late-rank fault (Δt = {value}) × every strategy",
                   "; ".join(f"{c['strategy']}: {c['cell']}" for c in late), tree, CMD_FAULTS)


@claim("M2", "Layer-wise gradient-distribution entropy H = 4.21 bits (BERT-base 2.03)",
       source="text 000 §2.1", outcomes=(Verdict.NOT_MEASURABLE,))
def gradient_entropy_proxy(rec: RunRecord) -> Finding:
    """Text 000's entropy is of an unspecified distribution: never judged; the mask entropy
    (P3's interface) is shown as the closest recorded figure, or said missing."""
    bits = curve(rec).get("mask_entropy_bits") or []
    if not bits:
        raise Missing("mask entropy not recorded")
    return Finding(Verdict.NOT_MEASURABLE,
                   "SparseGatingUnit.sparse_mask_entropy() over the curve run",
                   f"proxy: mean binary mask entropy {statistics.mean(bits):.3f} bits per unit "
                   "(≤ 1 by definition; text 000's 4.21 bits is of another distribution)",
                   "text 000 does not define the distribution", NOTHING)


@claim("M3", "Non-deterministic kernel launches put the same parameter in different DDP "
       "buckets on different ranks (layer.5.ffn.w1: bucket 3 vs 7)", source="text 000 §2.2",
       outcomes=(Verdict.REPRODUCED, Verdict.REFUTED, Verdict.NOT_MEASURABLE))
def bucket_layouts_differ_across_ranks(rec: RunRecord) -> Finding:
    """Reproduced if any strategy's per-rank bucket layouts differ; refuted if every recorded
    layout (≥ 2 ranks) is identical on all ranks."""
    align = section(rec, "faults").get("bucket_alignment")
    if not align:
        raise Missing("bucket alignment not recorded (needs ≥ 2 ranks)")
    ok = all(a["aligned"] for a in align)
    return Finding(Verdict.REFUTED if ok else Verdict.REPRODUCED,
                   "bucket layouts recorded on every rank (recording comm hook)",
                   "; ".join(f"{a['strategy']} ×{a['world_size']}: "
                             f"{'identical' if a['aligned'] else 'DIFFER'} over {a['steps']} steps"
                             for a in align), command=CMD_FAULTS)


def _mismatch_rows_at_8_ranks(rec: RunRecord) -> list[dict]:
    """``overflow.scale_mismatch`` rows at ≥ 8 ranks, each with its uniform-scale control."""
    recorded = (rec.section("overflow") or {}).get("scale_mismatch", [])
    rows = [r for r in recorded if r["world_size"] >= 8]
    if not rows:
        sizes = sorted({r["world_size"] for r in recorded})
        matrix = "; ".join(f"{c['strategy']}: {c['cell']}"
                           for c in fault_cases(rec, fault_name="scale-mismatch"))
        raise Missing("overflow.scale_mismatch at 8 ranks (allreduces, overflowed, corrupted) "
                      f"not recorded (recorded sizes: {sizes or 'none'})"
                      + (f"; fault matrix at 2 ranks: {matrix}" if matrix else ""))
    if any("overflowed_uniform" not in r for r in rows):
        raise Missing("overflow.scale_mismatch lacks the uniform-scale control "
                      "(overflowed_uniform): the mismatch's own effect cannot be separated")
    return rows


def _added_overflow(row: dict) -> float:
    """The share of allreduces that overflow with the mismatch but not at a uniform scale."""
    return (row["overflowed"] - row["overflowed_uniform"]) / max(1, row["allreduces"])


@claim("M4", "Ranks pre-scale FP16 gradients differently (2^12 vs 2^10), overflowing the "
       "FP16 accumulator in 3.2% of allreduces", source="text 000 §2.3", outcomes=ALL_FOUR)
def scale_mismatch_overflows_fp16(rec: RunRecord) -> Finding:
    """Reads ``overflow.scale_mismatch`` (a ddp-fp16 sum with 2^12 on every rank but one at
    2^10: allreduces, overflowed, corrupted, and ``overflowed_uniform`` — the same sum with 2^12
    on every rank, the control) at ≥ 8 ranks (text 000's 8-rank FP16 sum); with several
    workloads at that size, the one where the mismatch adds most overflow. The claim is that the
    *mismatch* overflows, so the effect is the overflow it adds over the uniform control.
    Reproduced if that excess is ≥ 1.6% of allreduces (half text 000's 3.2%); refuted if it adds
    none yet results are corrupted (the mismatch corrupts silently); else not reproduced."""
    r = max(_mismatch_rows_at_8_ranks(rec), key=lambda x: (x["world_size"], _added_overflow(x)))
    added = _added_overflow(r)
    label = (Verdict.REPRODUCED if added >= 0.032 / 2 else
             Verdict.REFUTED if added <= 0 and r["corrupted"] > 0 else Verdict.NOT_REPRODUCED)
    return Finding(label, f"rank-dependent pre-scale (2^12 / 2^10) on {r['world_size']} ranks"
                   + (f", {r['workload']} workload" if r.get("workload") else "")
                   + ", beside the same sum at a uniform 2^12",
                   f"{r['overflowed']} of {r['allreduces']} allreduces overflowed with the "
                   f"mismatch, {r['overflowed_uniform']} with a uniform scale (added: "
                   f"{pct(added)}); {r['corrupted']} corrupted silently",
                   "the overflow comes from the scale itself; the mismatch corrupts silently"
                   if label == Verdict.REFUTED else "", CMD_OVERFLOW)
