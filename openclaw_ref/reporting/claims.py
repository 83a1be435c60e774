"""The claims ledger: every seed claim, its source, and a verdict computed from the run record.

Each claim has a rule (its docstring states the rule) that reads only the validated
:class:`~openclaw_ref.reporting.record.RunRecord` and declares the outcomes it can return; the unit tests
drive every rule to every declared outcome with synthetic records (a rule that cannot flip is a
defect). Vocabulary:

- *reproduced* / *not reproduced*: the measured effect is at least / below the rule's threshold
  (for a claimed effect size, half of it: ``1 + (seed_ratio - 1) / 2``);
- *refuted*: the measurement contradicts the mechanism as described;
- *inside the noise here*: a timing claim whose bootstrap interval contains the threshold;
- *not measurable here*: the recorded environment lacks the hardware (named, with the command
  that measures it there), the repeats are too few, or the evidence was not recorded (said so);
- *setting*, *implemented* / *not implemented*, *open question*: descriptions of the seeds'
  setting, interfaces this suite provides, and questions the seeds ask; never *reproduced*.

Timing and skew are judged only at world sizes the recorded machine runs without sharing a
device (ranks <= cores on gloo, <= GPUs on NCCL), from at least ``MIN_REPEATS`` interleaved
repeats, with a seeded bootstrap interval on the ratio (:func:`metrics.bootstrap_ratio`).
"""

from __future__ import annotations

import itertools
import math
import re
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from openclaw_ref.core.metrics import bootstrap_ratio, percentile
from openclaw_ref.reporting.record import RunRecord, as_record

REPRODUCED = "reproduced"
NOT_REPRODUCED = "not reproduced"
REFUTED = "refuted"
INSIDE_NOISE = "inside the noise here"
NOT_MEASURABLE = "not measurable here"
SETTING = "setting"
IMPLEMENTED = "implemented"
NOT_IMPLEMENTED = "not implemented"
OPEN_QUESTION = "open question"
VERDICTS = (REPRODUCED, NOT_REPRODUCED, REFUTED, INSIDE_NOISE, NOT_MEASURABLE, SETTING,
            IMPLEMENTED, NOT_IMPLEMENTED, OPEN_QUESTION)

MIN_REPEATS = 5

CMD_COMPARE = "openclaw-bench compare"
CMD_REPEATS = f"openclaw-bench compare --repeats {MIN_REPEATS}"
CMD_NCCL8 = f"openclaw-bench compare --backend nccl --world-sizes 1,2,4,8 --repeats {MIN_REPEATS}"
CMD_NCCL4 = f"openclaw-bench compare --backend nccl --world-sizes 1,4 --repeats {MIN_REPEATS}"
CMD_CONFORM = "pytest -m conformance"
CMD_TREE = ("NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=COLL,TUNING openclaw-bench conform --backend nccl "
            "--world-size 8 --sync ddp --faults late-rank=2.2ms")
HW_8GPU = "8 GPUs with NCCL (the seed's 8×A100)"
HW_4GPU = "4 GPUs with NCCL (seed 004's devices=4)"


def half_effect(seed_ratio: float) -> float:
    """The threshold for a claimed ratio: half its distance from 1 (3.2× → 2.1×)."""
    return 1 + (seed_ratio - 1) / 2


def cmd_cores(ranks: int) -> str:
    """The command that measures a timing claim at ``ranks`` gloo ranks (on ≥ ranks cores)."""
    sizes = ",".join(map(str, sorted({1, 2, ranks})))
    return f"openclaw-bench compare --backend gloo --world-sizes {sizes} --repeats {MIN_REPEATS}"


@dataclass(frozen=True)
class Finding:
    label: str  # one of VERDICTS
    ran: str
    measured: str
    reason: str = ""
    command: str = CMD_COMPARE

    @property
    def verdict(self) -> str:
        return self.label + (f" ({self.reason})" if self.reason else "")


@dataclass(frozen=True)
class Claim:
    id: str
    text: str
    source: str  # seed document and section, see SOURCES
    assess: Callable[[RunRecord], Finding]
    outcomes: tuple[str, ...]  # every label the rule can return, each one tested


class Missing(Exception):
    """The evidence a rule reads is absent from the record; the message names it."""


SOURCES: dict[str, str] = {
    "seed 000": "「OpenCLAW 模型多GPU分布式训练中梯度同步不一致问题的系统性治理方案」: gradient-sync "
                "failures of the openclaw sparse model under DDP and the proposed fixes "
                "(§1 symptoms, §2 causes, §3 fix table, §4 implementation, §5 prevention and "
                "the 72-hour results, closing questions)",
    "seed 004": "「OpenClaw 的 PyTorch Lightning 训练」: training openclaw with PyTorch Lightning "
                "(pain points, Lightning comparison, implementation, benchmark table, pitfalls, "
                "outcome)",
}


# ---------------------------------------------------------------------------------------------
# Reading the record


def _section(rec: RunRecord, name: str) -> dict:
    section = rec.section(name)
    if not section:
        raise Missing(f"{name} section not recorded")
    return dict(section)


def _runs(rec: RunRecord, variant: str | None = None, w: int | None = None, *,
          failed: bool = False) -> list[dict]:
    """Strategy runs (successful ones unless ``failed``), optionally of one variant/size."""
    runs = _section(rec, "strategies").get("runs") or []
    if not runs:
        raise Missing("strategies section recorded no runs")
    return [r for r in runs if (("error" in r) == failed)
            and (variant is None or r["variant"] == variant)
            and (w is None or r["world_size"] == w)]


def _multi_sizes(rec: RunRecord) -> list[int]:
    return sorted({r["world_size"] for r in _runs(rec) if r["world_size"] >= 2})


def _fitting_size(rec: RunRecord, sizes: Sequence[int]) -> int | None:
    """The largest multi-rank size that runs without ranks sharing a core/GPU, if any."""
    fit = [w for w in sizes if 2 <= w <= rec.environment.capacity]
    return max(fit) if fit else None


def _unfit(rec: RunRecord, ran: str, sizes: Sequence[int], hardware: str, command: str,
           measured: str = "") -> Finding:
    """'Not measurable' for a timing claim whose multi-rank runs all oversubscribe the host."""
    env = rec.environment
    device = "GPUs" if env.backend == "nccl" else "cores"
    return Finding(NOT_MEASURABLE, ran, measured or f"runs at {list(sizes)} ranks, host has "
                   f"{env.capacity} {device}: ranks time-share, so timing reflects the host",
                   f"needs {hardware}; ranks ≤ {device}", command)


def _repeat_values(runs: list[dict], key: Callable[[dict], float | None]) -> dict[int, float]:
    return {r["repeat"]: v for r in runs if (v := key(r)) is not None}


def _paired(rec: RunRecord, num_variant: str, den_variant: str, w: int,
            key: Callable[[dict], float | None]) -> tuple[list[float], list[float]]:
    """Per-repeat values of two variants at one size, paired by repeat (interleaved runs)."""
    a = _repeat_values(_runs(rec, num_variant, w), key)
    b = _repeat_values(_runs(rec, den_variant, w), key)
    common = sorted(set(a) & set(b))
    return [a[i] for i in common], [b[i] for i in common]


def _step_ms(r: dict) -> float:
    return r["summary"]["median_step_ms"]


def _judge_ratio(num: Sequence[float], den: Sequence[float], threshold: float, what: str,
                 command: str = CMD_REPEATS) -> tuple[str, str, str]:
    """(label, reason, text) for 'ratio num/den ≥ threshold', judged by a bootstrap interval.

    Invariant: fewer than MIN_REPEATS pairs never produce a judged verdict."""
    if len(num) < MIN_REPEATS:
        reason = f"insufficient repeats: {len(num)} < {MIN_REPEATS}; run `{command}`"
        return NOT_MEASURABLE, reason, f"{what}: {len(num)} paired repeats"
    iv = bootstrap_ratio(num, den)
    text = (f"{what} {iv.point:.3f} (95% bootstrap interval {iv.low:.3f}–{iv.high:.3f}, "
            f"{iv.n} interleaved repeats; threshold {threshold:.3f})")
    if iv.low > threshold:
        return REPRODUCED, "", text
    if iv.high < threshold:
        return NOT_REPRODUCED, "", text
    return INSIDE_NOISE, "interval contains the threshold", text


def _missing_field(what: str) -> str:
    return f"evidence missing: {what}"


def _pct(x: float) -> str:
    return f"{100 * x:.3g}%"


def _curve(rec: RunRecord, label: str | None = None) -> dict:
    curves = _section(rec, "curves")
    if label is None:
        return next(iter(curves.values()))
    if label not in curves:
        raise Missing(f"{label} curve not recorded")
    return curves[label]


def _ms(value: str) -> float | None:
    """'250ms' / '5.7ms' / '2s' in milliseconds; None when unparseable."""
    m = re.fullmatch(r"\s*([\d.]+)\s*(ms|s)\s*", str(value))
    if not m:
        return None
    return float(m[1]) * (1e3 if m[2] == "s" else 1.0)


# ---------------------------------------------------------------------------------------------
# Setting (seed 000)


def s1(rec: RunRecord) -> Finding:
    """A setting, not a result: lists how this environment differs from the seed's."""
    env = rec.environment
    diffs = []
    if env.gpu_count < 8 or not any("A100" in m for m in env.gpu_models):
        diffs.append(f"{env.gpu_count} GPUs instead of 8×A100-80GB")
    if env.backend != "nccl" or env.nccl != "2.13.4":
        diffs.append(f"backend {env.backend}, NCCL {env.nccl or 'none'} instead of NCCL 2.13.4")
    if not env.torch.startswith("2.1."):
        diffs.append(f"torch {env.torch} instead of 2.1.0")
    if env.cuda != "12.1":
        diffs.append(f"CUDA {env.cuda or 'none'} instead of 12.1")
    gb = rec.config.get("global_batch")
    if gb != 256:
        diffs.append(f"global batch {gb} instead of 256")
    return Finding(SETTING, "—", f"here: {env.describe()}; differs: "
                   + ("; ".join(diffs) if diffs else "nothing"))


def s2(rec: RunRecord) -> Finding:
    """Implemented if the realized masked fraction stays in [0.12, 0.68] (±0.03), spans at
    least half that range (the path is dynamic), and the seed's parameter names were recorded."""
    c = _curve(rec)
    sp = c.get("realized_sparsity") or []
    if not sp:
        raise Missing("realized sparsity not recorded")
    lo, hi = min(sp), max(sp)
    names = ("layer.3.attn.v_proj.weight", "layer.5.ffn.w1.weight")
    absent = [n for n in names if n not in (c.get("grad_norms") or {})]
    in_range = 0.12 - 0.03 <= lo and hi <= 0.68 + 0.03 and hi - lo >= 0.28
    text = (f"realized masked fraction {lo:.3f}–{hi:.3f} over {len(sp)} steps; seed parameter "
            f"names recorded: {', '.join(n for n in names if n not in absent) or 'none'}")
    if in_range and not absent:
        return Finding(IMPLEMENTED, "the curve run's per-step sparsity and gradient names", text)
    why = "; ".join(filter(None, ["" if in_range else "sparsity outside/narrower than the seed's",
                                  f"absent: {', '.join(absent)}" if absent else ""]))
    return Finding(NOT_IMPLEMENTED, "the curve run's per-step sparsity and gradient names", text,
                   why)


# ---------------------------------------------------------------------------------------------
# Symptoms (seed 000 §1)


def val_spikes(validation: list[dict], rise: float = 0.05) -> list[int]:
    """Steps where validation loss rose more than ``rise`` (relative) over the previous point."""
    return [cur["step"] for prev, cur in itertools.pairwise(validation)
            if cur["loss"] > prev["loss"] * (1 + rise)]


def c1(rec: RunRecord) -> Finding:
    """Reproduced if ddp's validation rises (> 5%) recur at 37–42-step gaps (at least half of
    ≥ 2 gaps); not measurable if the validated span is shorter than 3 × 42 steps."""
    c = _curve(rec, "ddp")
    val = c.get("validation") or []
    span = val[-1]["step"] - val[0]["step"] if len(val) > 1 else 0
    ran = f"ddp, {len(c.get('loss', []))} steps on {c.get('world_size')} ranks"
    if span < 3 * 42:
        return Finding(NOT_MEASURABLE, ran, f"validated span {span} steps",
                       "curve too short for two 37–42-step gaps",
                       "openclaw-bench compare --curve-steps 300")
    spikes = val_spikes(val)
    gaps = [b - a for a, b in itertools.pairwise(spikes)]
    periodic = len(gaps) >= 2 and sum(37 <= g <= 42 for g in gaps) >= len(gaps) / 2
    return Finding(REPRODUCED if periodic else NOT_REPRODUCED, ran,
                   f"{len(spikes)} rises > 5% at steps {spikes[:8]}; gaps {gaps[:8]}")


def c2(rec: RunRecord) -> Finding:
    """Reproduced if rank 0's and the last rank's mean local gradient norm of
    layer.3.attn.v_proj.weight differ by ≥ 108.7% (half the seed's 217.4%), at the largest
    multi-rank ddp size (a numeric figure: no timing, so any rank count is fair)."""
    sizes = _multi_sizes(rec)
    if not sizes:
        raise Missing("no multi-rank run")
    w = sizes[-1]
    first, last = [], []
    for r in _runs(rec, "ddp", w):
        for per_rank in (r.get("grad_norms") or {}).get("layer.3.attn.v_proj.weight", []):
            if per_rank[0] is not None and per_rank[-1] is not None:
                first.append(per_rank[0])
                last.append(per_rank[-1])
    if not first:
        raise Missing("no gradient norms of layer.3.attn.v_proj.weight recorded")
    m0, m1 = statistics.mean(first), statistics.mean(last)
    rel = abs(m1 - m0) / min(m0, m1)
    return Finding(REPRODUCED if rel >= half_effect(3.174) - 1 else NOT_REPRODUCED,
                   f"ddp on {w} ranks, local norms before sync, {len(first)} steps",
                   f"rank 0 {m0:.3f} ± {statistics.pstdev(first):.3f}, rank {w - 1} "
                   f"{m1:.3f} ± {statistics.pstdev(last):.3f}: {_pct(rel)} apart")


def _skew_p99(r: dict) -> float | None:
    """A run's p99 bucket skew: recorded per run (schema 3), or from its skews (1–2)."""
    if r.get("skew_p99_ms") is not None:
        return r["skew_p99_ms"]
    return percentile(r["skew_ms"], 99) if r.get("skew_ms") else None


def c3(rec: RunRecord) -> Finding:
    """Reproduced if hardened fp32's per-repeat p99 bucket skew is above 3 ms: bootstrap interval
    of median p99 / 3 ms entirely above 1 (below 1: not reproduced; containing 1: noise)."""
    sizes = _multi_sizes(rec)
    w = _fitting_size(rec, sizes)
    ran = "hardened fp32: bucket-ready times in the control block"
    if w is None:
        return _unfit(rec, ran, sizes, f"{HW_8GPU} or ≥ 8 cores", CMD_NCCL8)
    p99 = _repeat_values(_runs(rec, "hardened fp32", w), _skew_p99)
    if not p99:
        raise Missing(f"no skew recorded at {w} ranks")
    label, reason, text = _judge_ratio(list(p99.values()), [3.0] * len(p99), 1.0,
                                       "p99 skew / 3 ms", cmd_cores(w))
    return Finding(label, ran + f" on {w} ranks (≤ {rec.environment.capacity})",
                   f"{text}; per-repeat p99 " + ", ".join(f"{v:.2f}" for v in p99.values())
                   + " ms", reason)


def c4(rec: RunRecord) -> Finding:
    """Reproduced if ≥ 80% of bucket-steps exceed 3 ms skew with the sparse path active AND the
    share drops ≥ 20 points with masking off (the claim is causal); else not reproduced. Judged
    only when the ablation ran at ranks ≤ cores/GPUs."""
    ab = (_section(rec, "ablations").get("sparsity")) or {}
    on, off = ab.get("sparse (seed range)"), ab.get("masking off (s = 0)")
    if not on or not off:
        raise Missing("sparse-vs-masking-off ablation not recorded")
    w = on["world_size"]
    ran = f"hardened fp32 on {w} ranks, sparse path on vs masking off"
    text = (f"{_pct(on['share_over_3ms'])} of {on['bucket_steps']} bucket-steps above 3 ms with "
            f"the seed's masking vs {_pct(off['share_over_3ms'])} with masking off (seed: 89.3%)")
    if w > rec.environment.capacity:
        return _unfit(rec, ran, [w], f"{HW_8GPU} or ≥ {w} cores", cmd_cores(w), text)
    causal = on["share_over_3ms"] >= 0.8 and on["share_over_3ms"] - off["share_over_3ms"] >= 0.2
    return Finding(REPRODUCED if causal else NOT_REPRODUCED, ran, text,
                   "" if causal else "skew does not follow the sparse path")


def c5(rec: RunRecord) -> Finding:
    """Counts steps whose bucket membership digests (names, shapes, dtypes) disagreed across
    ranks in hardened runs (≥ 2 ranks; a shape disagreement raises ShapeMismatch). Reproduced
    at ≥ 7.35% (half the seed's 14.7%); refuted when shapes never differ while the SET of
    parameters with a gradient does (ddp's presence manifests); else not reproduced."""
    hard = [r for r in _runs(rec) + _runs(rec, failed=True)
            if r["world_size"] >= 2 and r["variant"].startswith("hardened")]
    checked = sum(r["summary"].get("sync", {}).get("steps", 0) for r in hard if "error" not in r
                  and r["summary"].get("sync", {}).get("bucket_checks", 0) > 0)
    if not checked:
        raise Missing("no hardened run at ≥ 2 ranks verified bucket shapes")
    events = [e for r in hard for e in r.get("events", []) + [r.get("stopped_by") or {}]]
    shape_steps = sum(1 for e in events if e.get("kind") == "ShapeMismatch")  # one per step
    agree = [a for r in _runs(rec, "ddp") if r["world_size"] >= 2
             for a in r.get("grad_presence_agrees", [])]
    presence = 1 - sum(agree) / len(agree) if agree else 0.0
    rate = shape_steps / checked
    text = (f"shape disagreements in {shape_steps} of {checked} verified steps ({_pct(rate)}); "
            f"the set of parameters with a gradient differed in {_pct(presence)} of "
            f"{len(agree)} ddp steps")
    if rate >= 0.147 / 2:
        label = REPRODUCED
    elif shape_steps == 0 and presence > 0:
        label = REFUTED
    else:
        label = NOT_REPRODUCED
    return Finding(label, "hardened runs at ≥ 2 ranks (membership digest per bucket, every "
                   "step) and ddp's per-step presence manifests", text,
                   "what differs is gradient presence, not shape" if label == REFUTED else "")


def c6(rec: RunRecord) -> Finding:
    """Needs CUDA streams (NCCL on GPUs). There, reads ``strategies.cuda_sync_ablation``
    ({with, without}: {collectives, failed}): reproduced if the failure rate without
    synchronize is ≥ 3.85% (half the seed's 7.7%) and ≥ 10× the rate with it."""
    ran = "every strategy run of the comparison"
    env = rec.environment
    if env.backend != "nccl" or env.gpu_count < 2:
        try:
            steps = sum(len(r["step_ms"]) for r in _runs(rec)
                        if r["world_size"] >= 2 and r["sync"]["name"] != "local")
            failed = [r for r in _runs(rec, failed=True) if not r.get("stopped_by")]
            text = (f"{len(failed)} crashed runs; {steps} steps with a collective (runs ≥ 2 "
                    "ranks, local excluded), no device synchronize anywhere")
        except Missing as exc:
            text = _missing_field(str(exc))
        return Finding(NOT_MEASURABLE, ran, text, f"CUDA streams: needs {HW_8GPU}", CMD_NCCL8)
    ab = _section(rec, "strategies").get("cuda_sync_ablation")
    if not ab:
        raise Missing("strategies.cuda_sync_ablation (collectives/failed with and without "
                      "torch.cuda.synchronize) not recorded")
    rate = {k: ab[k]["failed"] / max(1, ab[k]["collectives"]) for k in ("with", "without")}
    ok = rate["without"] >= 0.077 / 2 and rate["without"] >= 10 * rate["with"]
    return Finding(REPRODUCED if ok else NOT_REPRODUCED, ran + ", with and without synchronize",
                   f"failure rate without {_pct(rate['without'])}, with {_pct(rate['with'])}")


def c7(rec: RunRecord) -> Finding:
    """'Gradient lifetime' is undefined in the seed: never judged. Shows the closest figure
    (when each rank's buckets became ready after its step start) or says it is missing."""
    sizes = _multi_sizes(rec)
    w = sizes[-1] if sizes else None
    last = [b for r in _runs(rec, "hardened fp32", w) for b in r["sync_last"].get("buckets", [])]
    if w is None or not last:
        raise Missing("no multi-rank bucket timings")
    ready = [t for b in last for t in b["ready_ms"]]
    return Finding(NOT_MEASURABLE, f"hardened fp32 on {w} ranks",
                   f"proxy: bucket-ready times {min(ready):.1f}–{max(ready):.1f} ms after step "
                   "start (last step of each run)", "undefined quantity; proxy shown")


# ---------------------------------------------------------------------------------------------
# Mechanisms (seed 000 §2)


def m1(rec: RunRecord) -> Finding:
    """Reproduced if a late rank shifts bucket boundaries (a BucketMisalignment in any
    late-rank case); refuted if none does with Δt ≥ 5.7 ms (covering the seed's range); not
    reproduced if none does with a smaller Δt. The ring→tree half needs NCCL."""
    faults = _section(rec, "faults")
    late = [c for c in faults.get("cases", []) if c.get("fault_name") == "late-rank"]
    if not late:
        raise Missing("late-rank not in the fault matrix")
    shifted = [c for c in late if "Misalignment" in (c.get("kind") or "") + (c.get("detail")
                                                                              or "")]
    value = (faults.get("settings") or {}).get("late_rank_value", "?")
    dt = _ms(value)
    tree = ("ring→tree half: not measurable here: needs NCCL on GPUs, run "
            f"`{CMD_TREE}`" if rec.environment.backend != "nccl" else
            "ring→tree half: evidence missing: NCCL's chosen algorithm not recorded")
    if shifted:
        label = REPRODUCED
    elif dt is not None and dt >= 5.7:
        label = REFUTED
    else:
        label = NOT_REPRODUCED
    return Finding(label, f"late-rank fault (Δt = {value}) × every strategy",
                   "; ".join(f"{c['strategy']}: {c['cell']}" for c in late), tree, CMD_CONFORM)


def m2(rec: RunRecord) -> Finding:
    """The seed's entropy is of an unspecified distribution: never judged; the mask entropy
    (P3's interface) is shown as the closest recorded figure, or said missing."""
    bits = _curve(rec).get("mask_entropy_bits") or []
    if not bits:
        raise Missing("mask entropy not recorded")
    return Finding(NOT_MEASURABLE, "SparseGatingUnit.sparse_mask_entropy() over the curve run",
                   f"proxy: mean binary mask entropy {statistics.mean(bits):.3f} bits per unit "
                   "(≤ 1 by definition; the seed's 4.21 bits is of another distribution)",
                   "the seed does not define the distribution")


def m3(rec: RunRecord) -> Finding:
    """Reproduced if any strategy's per-rank bucket layouts differ; refuted if every recorded
    layout (≥ 2 ranks) is identical on all ranks."""
    align = _section(rec, "faults").get("bucket_alignment")
    if not align:
        raise Missing("bucket alignment not recorded (needs ≥ 2 ranks)")
    ok = all(a["aligned"] for a in align)
    return Finding(REFUTED if ok else REPRODUCED,
                   "bucket layouts recorded on every rank (recording comm hook)",
                   "; ".join(f"{a['strategy']} ×{a['world_size']}: "
                             f"{'identical' if a['aligned'] else 'DIFFER'} over {a['steps']} steps"
                             for a in align), command=CMD_CONFORM)


def m4(rec: RunRecord) -> Finding:
    """Reads ``overflow.scale_mismatch`` (a ddp-fp16 sum with 2^12 on every rank but one at
    2^10: allreduces, overflowed, corrupted, and ``overflowed_uniform`` — the same sum with 2^12
    on every rank, the control) at ≥ 8 ranks (the seed's 8-rank FP16 sum); with several
    workloads at that size, the one where the mismatch adds most overflow. The claim is that the
    *mismatch* overflows, so the effect is the overflow it adds over the uniform control.
    Reproduced if that excess is ≥ 1.6% of allreduces (half the seed's 3.2%); refuted if it adds
    none yet results are corrupted (the mismatch corrupts silently); else not reproduced."""
    cells = [c for c in (rec.section("faults") or {}).get("cases", [])
             if c.get("fault_name") == "scale-mismatch"]
    matrix = "; ".join(f"{c['strategy']}: {c['cell']}" for c in cells)
    rows = [r for r in (rec.section("overflow") or {}).get("scale_mismatch", [])
            if r["world_size"] >= 8]
    if not rows:
        sizes = sorted({r["world_size"] for r in (rec.section("overflow") or {})
                        .get("scale_mismatch", [])})
        raise Missing("overflow.scale_mismatch at 8 ranks (allreduces, overflowed, corrupted) "
                      f"not recorded (recorded sizes: {sizes or 'none'})"
                      + (f"; fault matrix at 2 ranks: {matrix}" if matrix else ""))
    if any("overflowed_uniform" not in r for r in rows):
        raise Missing("overflow.scale_mismatch lacks the uniform-scale control "
                      "(overflowed_uniform): the mismatch's own effect cannot be separated")

    def excess(x: dict) -> float:
        return (x["overflowed"] - x["overflowed_uniform"]) / max(1, x["allreduces"])

    r = max(rows, key=lambda x: (x["world_size"], excess(x)))
    added = excess(r)
    label = (REPRODUCED if added >= 0.032 / 2 else
             REFUTED if added <= 0 and r["corrupted"] > 0 else NOT_REPRODUCED)
    return Finding(label, f"rank-dependent pre-scale (2^12 / 2^10) on {r['world_size']} ranks"
                   + (f", {r['workload']} workload" if r.get("workload") else "")
                   + ", beside the same sum at a uniform 2^12",
                   f"{r['overflowed']} of {r['allreduces']} allreduces overflowed with the "
                   f"mismatch, {r['overflowed_uniform']} with a uniform scale (added: "
                   f"{_pct(added)}); {r['corrupted']} corrupted silently",
                   "the overflow comes from the scale itself; the mismatch corrupts silently"
                   if label == REFUTED else "", CMD_CONFORM)


# ---------------------------------------------------------------------------------------------
# Fixes (seed 000 §3–4)


def _sync_failures(runs: list[dict], failed: list[dict]) -> int:
    """Runs that crashed (not stopped by a check on purpose) or ended with unequal replicas."""
    return (sum(1 for r in failed if not r.get("stopped_by"))
            + sum(1 for r in runs if not r["summary"]["replicas_equal"]))


def f1(rec: RunRecord) -> Finding:
    """Sync failures (crashed runs or unequal replicas) of ddp vs hardened fp32 at ≥ 2 ranks.
    Not measurable when ddp never fails here (nothing to reduce); else reproduced if the
    reduction is ≥ 49.4% (half the seed's 98.7%)."""
    def multi(rs: list[dict]) -> list[dict]:
        return [r for r in rs if r["world_size"] >= 2]

    base = _sync_failures(multi(_runs(rec, "ddp")), multi(_runs(rec, "ddp", failed=True)))
    hard_runs = multi(_runs(rec, "hardened fp32"))
    hard = _sync_failures(hard_runs, multi(_runs(rec, "hardened fp32", failed=True)))
    alarms = sum(len(r.get("events", [])) for r in hard_runs)
    checks = sum(r["summary"].get("sync", {}).get("checks_run", 0) for r in hard_runs)
    text = (f"sync failures: ddp {base}, hardened {hard}; hardened raised {alarms} alarms in "
            f"{checks} checks on these clean runs")
    ran = "ddp vs hardened fp32 (our logical-clock checks), every size ≥ 2, clean"
    if base == 0:
        return Finding(NOT_MEASURABLE, ran, text, f"no baseline sync failure here to reduce; "
                       f"the seed's failures need {HW_8GPU}", CMD_NCCL8)
    cut = 1 - hard / base
    return Finding(REPRODUCED if cut >= 0.987 / 2 else NOT_REPRODUCED, ran,
                   text + f": {_pct(cut)} fewer")


F2_SEED = "bucketed norm-ema (seed F2)"


def f2(rec: RunRecord) -> Finding:
    """Refuted if the seed's rank-local norm bucketing is stopped by a bucket misalignment at
    ≥ 2 ranks (its buckets differ per rank). Otherwise its throughput vs static bucketing
    (static / seed step time, paired repeats at ranks ≤ cores) is judged against 1.186 (half
    the seed's +37.2%)."""
    stopped = [r["stopped_by"] for r in _runs(rec, F2_SEED, failed=True)
               if r["world_size"] >= 2 and r.get("stopped_by")]
    stopped += [e for r in _runs(rec, F2_SEED) if r["world_size"] >= 2
                for e in r.get("events", []) if "Misalignment" in e.get("kind", "")]
    ran = "bucketed engine, planners static / norm-ema (seed, rank-local) / norm-ema-agreed"
    if stopped:
        kinds = sorted({e["kind"] for e in stopped})
        return Finding(REFUTED, ran, f"the seed's rank-local planner: {kinds} on "
                       f"{len(stopped)} runs", "buckets differ per rank, as M3 warns")
    sizes = _multi_sizes(rec)
    w = _fitting_size(rec, sizes)
    if w is None:
        return _unfit(rec, ran, sizes, f"{HW_8GPU} or ≥ 8 cores", CMD_NCCL8)
    static, seed = _paired(rec, "bucketed static", F2_SEED, w, _step_ms)
    if not static:
        raise Missing(f"no paired static / seed-planner runs at {w} ranks")
    label, reason, text = _judge_ratio(static, seed, half_effect(1.372),
                                       "throughput ratio (static / seed step ms)", cmd_cores(w))
    return Finding(label, ran + f", {w} ranks", text, reason)


def _f3_role(row: dict) -> str | None:
    """base: stock ddp-fp16; seed: the hardened fp16 wire at the seed's uniform 2^12 (4096);
    auto: this suite's adaptive scale (shown only)."""
    if row["strategy"] == "ddp-fp16":
        return "base"
    if row["strategy"].startswith("hardened-fp16") and row.get("wire", "fp16") == "fp16":
        return {"4096": "seed", "auto": "auto"}.get(str(row.get("scale")))
    return None


def f3(rec: RunRecord) -> Finding:
    """The seed's uniform 2^12 pre-scale (hardened fp16, scale 4096) vs stock ddp-fp16 on the
    same workload and size. Refuted if it overflows more than ddp-fp16 anywhere; not
    measurable if ddp-fp16 never overflows (nothing to reduce); reproduced if, wherever
    ddp-fp16 overflows, the seed's variant overflows ≤ 0.017% and less; else not reproduced.
    The `auto` scale is shown, never judged (it is this suite's, not the seed's)."""
    rates = _section(rec, "overflow").get("rates") or []
    cells: dict[tuple[str, int], dict[str, dict]] = {}
    for r in rates:
        role = _f3_role(r)
        if role:
            cells.setdefault((r["workload"], r["world_size"]), {})[role] = r
    pairs = {k: v for k, v in cells.items() if "base" in v and "seed" in v}
    if not pairs:
        raise Missing("stock ddp-fp16 and the seed's uniform 2^12 variant on a common workload")
    text = "; ".join(
        f"{wl} ×{w}: ddp-fp16 {_pct(v['base']['overflow_rate'])}, seed 2^12 "
        f"{_pct(v['seed']['overflow_rate'])} ({v['seed']['skipped_steps']}/{v['seed']['steps']}"
        " steps skipped)" + (f", auto {_pct(v['auto']['overflow_rate'])}" if "auto" in v else "")
        for (wl, w), v in sorted(pairs.items()))
    sizes = sorted({w for _, w in pairs})
    ran = f"overflowed elements after the sync, {sizes} ranks" + (
        "" if max(sizes) >= 8 else " (8 ranks not recorded)")
    worse = [k for k, v in pairs.items()
             if v["seed"]["overflow_rate"] > v["base"]["overflow_rate"]]
    hot = [v for v in pairs.values() if v["base"]["overflow_rate"] > 0]
    if worse:
        return Finding(REFUTED, ran, text, "the uniform pre-scale overflows more than stock "
                       f"ddp-fp16 on {', '.join(f'{wl} ×{w}' for wl, w in sorted(worse))}",
                       CMD_CONFORM)
    if not hot:
        return Finding(NOT_MEASURABLE, ran, text, "stock ddp-fp16 never overflows on these "
                       "workloads: nothing to reduce", CMD_CONFORM)
    ok = all(v["seed"]["overflow_rate"] <= 0.00017
             and v["seed"]["overflow_rate"] < v["base"]["overflow_rate"] for v in hot)
    return Finding(REPRODUCED if ok else NOT_REPRODUCED, ran, text, command=CMD_CONFORM)


def f4(rec: RunRecord) -> Finding:
    """Refuted as written if the recorded lint of the seed's settings has an error (a name NCCL
    does not read); otherwise the performance half needs NCCL on GPUs (not measurable)."""
    doctor = _section(rec, "doctor")
    findings = doctor.get("findings") or []
    text = "; ".join(f"{f['level']}: {f['variable']} → {f['replacement']}" for f in findings)
    ran = "doctor's lint of the seed's NCCL settings (recorded by compare)"
    if any(f["level"] == "error" for f in findings):
        return Finding(REFUTED, ran, text, "a variable NCCL does not read",
                       "NCCL_RING_ALGO=1 NCCL_MIN_NRINGS=4 openclaw-bench doctor")
    return Finding(NOT_MEASURABLE, ran, text or "no finding",
                   f"the settings' performance needs {HW_8GPU}", CMD_NCCL8)


F5_STRATEGY = "seed-f5"
F5_GUARDS = ("scale-mismatch",)  # it claims to normalize the FP16 scale ...
F5_LAYOUT = ("local-buckets", "permuted-params")  # ... and to assert shapes agree


def f5(rec: RunRecord) -> Finding:
    """Reads fault-matrix cases of the seed's hook as written (strategy ``seed-f5``: forward
    hook registered before wrapping, rank-0 assertion over its own shapes, ×2^12 never undone),
    including a fault-free case (fault ``none``). Refuted if it breaks the fault-free run;
    reproduced if it detects the scale mismatch and a layout fault; else not reproduced."""
    cases = [c for c in (rec.section("faults") or {}).get("cases", [])
             if c.get("strategy") == F5_STRATEGY]
    if not cases:
        raise Missing(f"fault-matrix cases of the seed's hook as written (strategy "
                      f"{F5_STRATEGY!r}, with a fault-free case) not recorded")
    outcome = {c["fault_name"]: c["outcome"] for c in cases}
    caught = sorted(k for k, v in outcome.items() if v == "detected")
    missed = sorted(k for k, v in outcome.items() if v != "detected" and k != "none")
    text = (f"fault-free run: {outcome.get('none', 'not run')}; detects {caught or 'nothing'}; "
            f"misses {missed or 'nothing'}")
    ran = "the seed's hook as written, fault × outcome matrix"
    if outcome.get("none") not in (None, "no-effect"):
        return Finding(REFUTED, ran, text, "breaks a fault-free run", CMD_CONFORM)
    ok = all(g in caught for g in F5_GUARDS) and any(g in caught for g in F5_LAYOUT)
    return Finding(REPRODUCED if ok else NOT_REPRODUCED, ran, text, command=CMD_CONFORM)


# ---------------------------------------------------------------------------------------------
# Prevention (seed 000 §5)


def p1(rec: RunRecord) -> Finding:
    """Needs NCCL on GPUs. There, reads ``nccl_versions`` rows (nccl, allreduces, lost):
    reproduced if 2.12.x loses ≥ 6.35% (half the seed's 12.7%) and ≥ 2.13.4 loses less."""
    env = rec.environment
    ran = "doctor refuses NCCL < 2.13.4 (unit-tested); allreduce loss per NCCL version"
    if env.backend != "nccl" or env.nccl is None:
        return Finding(NOT_MEASURABLE, ran, f"NCCL here: {env.nccl or 'none'}",
                       f"needs {HW_8GPU} under NCCL 2.12.x and ≥ 2.13.4", CMD_NCCL8)
    rows = (rec.section("doctor") or {}).get("nccl_versions")
    if not rows:
        raise Missing("doctor.nccl_versions (allreduces lost per NCCL version) not recorded")
    loss = {r["nccl"]: r["lost"] / max(1, r["allreduces"]) for r in rows}
    old = [v for k, v in loss.items() if k.startswith("2.12.")]
    new = [v for k, v in loss.items() if not k.startswith(("2.12.", "2.11.", "2.10."))]
    ok = bool(old and new) and min(old) >= 0.127 / 2 and max(new) < min(old)
    return Finding(REPRODUCED if ok else NOT_REPRODUCED, ran,
                   "; ".join(f"NCCL {k}: {_pct(v)} lost" for k, v in sorted(loss.items())))


def p2(rec: RunRecord) -> Finding:
    """The barrier policy is reproduced as a fix if it makes steps faster with the seed's Δt
    jitter injected: interval of off / on step time (paired repeats) above 1; below 1 not
    reproduced; containing 1 inside the noise. Judged only at ranks ≤ cores/GPUs."""
    ab = _section(rec, "ablations")
    rows = {r["arm"]: r for r in ab.get("skew_barrier", [])}
    reps = ab.get("skew_barrier_repeats") or {}
    if "on" not in rows or "off" not in rows:
        raise Missing("P2 barrier arms not recorded")
    w = rows["on"]["world_size"]
    ran = f"P2 barrier on vs off, {w} ranks, the seed's Δt jitter injected"
    shown = (f"median step {rows['off']['median_step_ms']:.1f} → "
             f"{rows['on']['median_step_ms']:.1f} ms; {rows['on']['barriers']} barriers in "
             f"{rows['on']['steps']} steps")
    if w > rec.environment.capacity:
        return _unfit(rec, ran, [w], f"≥ {w} cores or GPUs", cmd_cores(w), shown)
    off = [r["median_step_ms"] for r in reps.get("off", [])]
    on = [r["median_step_ms"] for r in reps.get("on", [])]
    n = min(len(off), len(on))
    label, reason, text = _judge_ratio(off[:n], on[:n], 1.0, "speed-up (off / on step ms)")
    if not reps:
        reason = _missing_field("ablations.skew_barrier_repeats (per-repeat arms)")
    return Finding(label, ran, f"{shown}; {text}", reason)


def p3(rec: RunRecord) -> Finding:
    """Implemented if the model exposed a finite mask entropy in [0, 1] bit at every recorded
    step of the curve run; else not implemented."""
    c = _curve(rec)
    bits = c.get("mask_entropy_bits")
    if bits is None:
        raise Missing("mask entropy not recorded")
    steps = len(c.get("loss") or bits)
    ok = len(bits) == steps and all(isinstance(b, (int, float)) and math.isfinite(b)
                                    and 0.0 <= b <= 1.0 for b in bits)
    return Finding(IMPLEMENTED if ok else NOT_IMPLEMENTED,
                   "SparseGatingUnit.sparse_mask_entropy(), read every step",
                   f"{len(bits)} values over {steps} steps"
                   + (f", mean {statistics.mean(bits):.3f} bits" if ok and bits else ""))


# ---------------------------------------------------------------------------------------------
# Results of the fixes (seed 000, 72-hour run)


def r1(rec: RunRecord) -> Finding:
    """Consistency = passed / run checks of hardened fp32 (clean runs). With 0 failures the
    95% bound on the failure rate is 3/n (rule of three): reproduced once 3/n ≤ 1e-5, else not
    measurable (too few checks, with the steps that would suffice); with failures, reproduced
    if the rate is ≤ 1e-5, else not reproduced."""
    runs = _runs(rec, "hardened fp32")
    n = sum(r["summary"].get("sync", {}).get("checks_run", 0) for r in runs)
    passed = sum(r["summary"].get("sync", {}).get("checks_passed", 0) for r in runs)
    if not n:
        raise Missing("no hardened checks recorded")
    k = n - passed
    text = f"hardened checks passed {passed}/{n} ({100 * passed / n:.4f}%; seed 99.9994%)"
    ran = "hardened fp32, clean runs, every size"
    if k == 0 and 3 / n > 1e-5:
        steps = math.ceil(rec.config.get("steps", 40) * 3e5 / n / 100) * 100
        return Finding(NOT_MEASURABLE, ran, text, f"insufficient checks: {n} < 300,000 to "
                       "bound failures below 1e-5", f"openclaw-bench compare --steps {steps}")
    return Finding(REPRODUCED if k / n <= 1e-5 else NOT_REPRODUCED, ran, text)


def r2(rec: RunRecord) -> Finding:
    """Step-time CV of ddp / hardened fp32 (paired repeats, ranks ≤ cores/GPUs) against 4.57
    (half the seed's 0.187 / 0.023 = 8.1×), by bootstrap interval."""
    sizes = _multi_sizes(rec)
    w = _fitting_size(rec, sizes)
    ran = "per-run step-time CV, ddp vs hardened fp32"
    if w is None:
        return _unfit(rec, ran, sizes, f"{HW_8GPU} or ≥ 8 cores", CMD_NCCL8)
    ddp, hard = _paired(rec, "ddp", "hardened fp32", w, lambda r: r["summary"]["step_ms_cv"])
    if not ddp:
        raise Missing(f"no paired ddp / hardened runs at {w} ranks")
    label, reason, text = _judge_ratio(ddp, hard, half_effect(0.187 / 0.023),
                                       "CV ratio ddp / hardened", cmd_cores(w))
    return Finding(label, ran + f", {w} ranks", text + " (seed: 0.187 / 0.023)", reason)


def steps_to(validation: list[dict], threshold: float) -> int | None:
    return next((v["step"] for v in validation if v["loss"] < threshold), None)


def r3(rec: RunRecord) -> Finding:
    """Not measurable when ddp's curve synchronized correctly (replicas equal, no event): the
    fix has nothing to speed up. Otherwise reproduced if hardened reaches a quarter of ddp's
    first validation loss in ≤ 1/1.585 of ddp's steps (half the seed's 2.17×)."""
    d, h = _curve(rec, "ddp"), _curve(rec, "hardened fp32")
    dv, hv = d.get("validation") or [], h.get("validation") or []
    if not dv or not hv:
        raise Missing("validation curves not recorded")
    identical = d.get("loss") == h.get("loss")
    ran = "ddp vs hardened fp32 validation curves"
    if d["summary"]["replicas_equal"] and not d.get("events"):
        return Finding(NOT_MEASURABLE, ran, "ddp's replicas stayed equal with no event"
                       + ("; the two loss curves are bitwise identical" if identical else ""),
                       f"no sync failure here for a fix to cure; needs {HW_8GPU}", CMD_NCCL8)
    threshold = 0.25 * dv[0]["loss"]
    sd, sh = steps_to(dv, threshold), steps_to(hv, threshold)
    sd_eff = sd if sd is not None else dv[-1]["step"] + 1
    ratio = sd_eff / sh if sh else 0.0
    return Finding(REPRODUCED if ratio >= half_effect(2.17) else NOT_REPRODUCED, ran,
                   f"to val loss < {threshold:.3f}: ddp {sd if sd is not None else 'never'}, "
                   f"hardened {sh if sh is not None else 'never'} steps ({ratio:.2f}×)")


def r4(rec: RunRecord) -> Finding:
    """Needs peak memory per run (``summary.peak_memory_scope == "run"``: a fresh process or a
    reset high-water mark); ru_maxrss in a reused pool is per process. Then reproduced if the
    best hardened/bucketed variant peaks ≥ 9.65% (half the seed's 19.3%) below ddp."""
    sizes = _multi_sizes(rec)
    if not sizes:
        raise Missing("no multi-rank run")
    w = sizes[-1]
    scoped = [r for r in _runs(rec, w=w) if r["summary"].get("peak_memory_scope") == "run"]
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
    ok = min(others.values()) <= (1 - 0.193 / 2) * d
    return Finding(REPRODUCED if ok else NOT_REPRODUCED, ran, "; ".join(
        f"{v} {m:.0f} MiB" for v, m in others.items()) + f"; ddp {d:.0f} MiB")


def r5(rec: RunRecord) -> Finding:
    """Needs NCCL. There, reads ``nccl_log`` (baseline_per_hour, fixed_per_hour): reproduced if
    error lines drop ≥ 49.6% (half the seed's 99.3%)."""
    ran = "NCCL error log lines per hour, baseline vs fix"
    if rec.environment.backend != "nccl":
        return Finding(NOT_MEASURABLE, ran, f"backend {rec.environment.backend}: no NCCL log",
                       f"needs {HW_8GPU} for a long run", CMD_NCCL8)
    log = (rec.section("strategies") or {}).get("nccl_log")
    if not log:
        raise Missing("strategies.nccl_log (error lines per hour, baseline and fix)")
    cut = 1 - log["fixed_per_hour"] / max(1e-9, log["baseline_per_hour"])
    return Finding(REPRODUCED if cut >= (1 - 0.3 / 42.7) / 2 else NOT_REPRODUCED, ran,
                   f"{log['baseline_per_hour']:.1f}/h → {log['fixed_per_hour']:.1f}/h")


def open_question(rec: RunRecord) -> Finding:
    """A question the seed asks, not a claim: listed, never judged."""
    return Finding(OPEN_QUESTION, "—", "a question, not a claim")


# ---------------------------------------------------------------------------------------------
# Lightning (seed 004)


def _precision_rows(rec: RunRecord) -> list[dict]:
    rows = _section(rec, "precision").get("rows_data")
    if not rows:
        raise Missing("precision matrix empty")
    return rows


def l1(rec: RunRecord) -> Finding:
    """Needs a GPU. There, extrapolates the 1-device fp32 s/iter to 1M samples: reproduced if
    it exceeds 12 h (for this suite's preset), else not reproduced."""
    ran = "1-device fp32 time per iteration, extrapolated to 1M samples"
    if rec.environment.gpu_count < 1:
        return Finding(NOT_MEASURABLE, ran, "no GPU recorded", "needs a GPU",
                       "openclaw-bench compare --backend nccl --sections precision")
    one = next((r for r in _precision_rows(rec)
                if r["world_size"] == 1 and r["precision"] == "fp32"), None)
    if one is None:
        raise Missing("1-device fp32 row")
    hours = one["s_per_iter"] * 1e6 / rec.config.get("global_batch", 32) / 3600
    return Finding(REPRODUCED if hours > 12 else NOT_REPRODUCED, ran,
                   f"{hours:.1f} h for 1M samples (seed: > 12 h; OOM part not measured)")


def l2(rec: RunRecord) -> Finding:
    """Implemented if the recorded Lightning run used DDP on ≥ 2 devices with mixed precision
    and trained (steps > 0, finite loss); else not implemented."""
    lt = _section(rec, "lightning")
    ok = (lt.get("devices", 0) >= 2 and "ddp" in str(lt.get("strategy", ""))
          and any(p in str(lt.get("precision", "")) for p in ("16", "bf16"))
          and lt.get("steps", 0) > 0 and math.isfinite(lt.get("final_loss", math.nan)))
    return Finding(IMPLEMENTED if ok else NOT_IMPLEMENTED,
                   f"Lightning Trainer(accelerator={lt.get('accelerator')!r}, "
                   f"devices={lt.get('devices')}, precision={lt.get('precision')!r}, "
                   f"strategy={lt.get('strategy')!r})",
                   f"{lt.get('steps')} steps, {lt.get('steps_per_s', float('nan')):.2f} steps/s, "
                   f"final loss {lt.get('final_loss', float('nan')):.4f}",
                   "" if ok else "the run lacks DDP, mixed precision or training progress",
                   "pytest tests/test_lightning.py")


def _speedup(rec: RunRecord, multi: Callable[[dict], bool], threshold: float, hardware: str,
             command: str) -> Finding:
    """1-device fp32 / N-device s/iter at equal global batch, from per-repeat figures."""
    rows = _precision_rows(rec)
    one = next((r for r in rows if r["world_size"] == 1 and r["precision"] == "fp32"), None)
    many = [r for r in rows if multi(r)]
    if one is None or not many:
        raise Missing("precision rows incomplete")
    best = min(many, key=lambda r: r["s_per_iter"])
    ran = f"seed 004's matrix: 1 device fp32 vs {best['label']}"
    shown = f"single figures: {one['s_per_iter'] / best['s_per_iter']:.2f}× speed-up"
    if best["world_size"] > rec.environment.capacity:
        return _unfit(rec, ran, [best["world_size"]], hardware, command, shown)
    a, b = one.get("s_per_iter_repeats") or [], best.get("s_per_iter_repeats") or []
    n = min(len(a), len(b))
    label, reason, text = _judge_ratio(a[:n], b[:n], threshold, "speed-up", command)
    if not (a and b):
        reason = _missing_field("precision.rows_data[].s_per_iter_repeats")
    return Finding(label, ran, f"{shown}; {text}", reason)


def l3(rec: RunRecord) -> Finding:
    """Needs 4 GPUs. Judged on 1-GPU fp32 / 4-GPU DDP+AMP s/iter against 3.1 (half the
    seed's 0.42 / 0.08 = 5.25×), by bootstrap over repeats."""
    if rec.environment.backend != "nccl" or rec.environment.gpu_count < 4:
        rows = (rec.section("precision") or {}).get("rows_data") or []
        return Finding(NOT_MEASURABLE, "seed 004's matrix on this machine",
                       "; ".join(f"{r['label']}: {r['s_per_iter']:.3f} s/iter" for r in rows)
                       or "no precision rows", f"needs {HW_4GPU}", CMD_NCCL4)
    return _speedup(rec, lambda r: r["world_size"] >= 4 and r["precision"] == "amp",
                    half_effect(0.42 / 0.08), HW_4GPU, CMD_NCCL4)


def l4(rec: RunRecord) -> Finding:
    """Implemented if the recorded Lightning run seeded workers and used the weighted sampler,
    and an int8 model (fbgemm/x86) was measured; not implemented if any part failed."""
    lt, q = _section(rec, "lightning"), _section(rec, "quantization")
    ok = (bool(lt.get("seed_everything_workers")) and bool(lt.get("weighted_sampler"))
          and "error" not in q and q.get("accuracy_int8") is not None)
    text = (f"seed_everything(workers=True): {bool(lt.get('seed_everything_workers'))}; "
            f"WeightedRandomSampler: {bool(lt.get('weighted_sampler'))}; int8 "
            f"({q.get('backend')}): " + (f"accuracy {q.get('accuracy_fp32')} → "
                                         f"{q.get('accuracy_int8')}, latency "
                                         f"{q.get('latency_fp32_ms')} → {q.get('latency_int8_ms')}"
                                         " ms" if "error" not in q else f"error {q['error']}"))
    return Finding(IMPLEMENTED if ok else NOT_IMPLEMENTED, "Lightning pitfalls and int8 "
                   "quantization of the trained model on CPU", text)


def l5(rec: RunRecord) -> Finding:
    """Speed-up of N-device DDP (any precision) over 1-device fp32 at equal global batch, judged
    against 2.1 (half the seed's 3.2×) only when N ≤ cores/GPUs and from ≥ 5 repeats. The
    memory (−47%) and accuracy (±0.5%) parts are not judged (not recorded per run)."""
    return _speedup(rec, lambda r: r["world_size"] > 1, half_effect(3.2),
                    f"{HW_4GPU} or ≥ 4 cores", CMD_NCCL4)


SYMPTOMS = "seed 000 §1"
CLAIMS: tuple[Claim, ...] = (
    Claim("S1", "Original setting: 8×A100-80GB (DGX-A100), global batch 256, DDP, PyTorch "
          "2.1.0, NCCL 2.13.4, CUDA 12.1", "seed 000 §1", s1, (SETTING,)),
    Claim("S2", "Dynamic sparse path, sparsity ratio in [0.12, 0.68], a SparseGatingUnit; "
          "parameters such as layer.3.attn.v_proj.weight, layer.5.ffn.w1", "seed 000 §1, §2.2",
          s2, (IMPLEMENTED, NOT_IMPLEMENTED, NOT_MEASURABLE)),
    Claim("C1", "Validation-loss spikes recur every 37–42 steps", SYMPTOMS, c1,
          (REPRODUCED, NOT_REPRODUCED, NOT_MEASURABLE)),
    Claim("C2", "Local grad L2 norm of layer.3.attn.v_proj.weight differs 217.4% between rank 0 "
          "and rank 7 (0.89 ± 0.32 vs 2.76 ± 0.81)", SYMPTOMS, c2,
          (REPRODUCED, NOT_REPRODUCED, NOT_MEASURABLE)),
    Claim("C3", "The same 1.2 MB allreduce takes 1.83 ms on one rank and 4.91 ms on another: "
          "skew over a 3 ms threshold", SYMPTOMS, c3,
          (REPRODUCED, NOT_REPRODUCED, INSIDE_NOISE, NOT_MEASURABLE)),
    Claim("C4", "The skew appears in 89.3% of steps when the sparse path is active "
          "(n = 12,417)", SYMPTOMS, c4, (REPRODUCED, NOT_REPRODUCED, NOT_MEASURABLE)),
    Claim("C5", "Gradient shapes disagree across ranks in 14.7% of steps (ResNet-50: 0.2%)", SYMPTOMS,
          c5, (REPRODUCED, NOT_REPRODUCED, REFUTED, NOT_MEASURABLE)),
    Claim("C6", "AllReduce success 92.3% without torch.cuda.synchronize(), 99.998% with it", SYMPTOMS,
          c6, (REPRODUCED, NOT_REPRODUCED, NOT_MEASURABLE)),
    Claim("C7", "Gradient lifetime differs across ranks: 1.2 ms shortest, 7.9 ms longest", SYMPTOMS,
          c7, (NOT_MEASURABLE,)),
    Claim("M1", "A per-rank mask delay Δt ∈ [0.3, 5.7] ms lets a ring member run ahead and "
          "shifts bucket boundaries; above 2.1 ms NCCL falls back from ring to tree",
          "seed 000 §2.1", m1, (REPRODUCED, NOT_REPRODUCED, REFUTED, NOT_MEASURABLE)),
    Claim("M2", "Layer-wise gradient-distribution entropy H = 4.21 bits (BERT-base 2.03)",
          "seed 000 §2.1", m2, (NOT_MEASURABLE,)),
    Claim("M3", "Non-deterministic kernel launches put the same parameter in different DDP "
          "buckets on different ranks (layer.5.ffn.w1: bucket 3 vs 7)", "seed 000 §2.2", m3,
          (REPRODUCED, REFUTED, NOT_MEASURABLE)),
    Claim("M4", "Ranks pre-scale FP16 gradients differently (2^12 vs 2^10), overflowing the "
          "FP16 accumulator in 3.2% of allreduces", "seed 000 §2.3", m4,
          (REPRODUCED, NOT_REPRODUCED, REFUTED, NOT_MEASURABLE)),
    Claim("F1", "Layer-wise checkpoints + async NCCL error handling (logical clock): sync "
          "failure rate −98.7%", "seed 000 §3", f1, (REPRODUCED, NOT_REPRODUCED, NOT_MEASURABLE)),
    Claim("F2", "Buckets by layer-wise L2 norm (τ = 0.85 × EMA, α = 0.999): AllReduce "
          "throughput +37.2%", "seed 000 §3, §4.2", f2,
          (REFUTED, REPRODUCED, NOT_REPRODUCED, INSIDE_NOISE, NOT_MEASURABLE)),
    Claim("F3", "One uniform FP16 pre-scale (2^12) on every rank, removed after the allreduce: "
          "overflow down to 0.017%", "seed 000 §3, §4.3", f3,
          (REFUTED, REPRODUCED, NOT_REPRODUCED, NOT_MEASURABLE)),
    Claim("F4", "NCCL environment: async error handling, ring algorithm, ≥ 4 rings, 2 MB "
          "buffer", "seed 000 §4.1", f4, (REFUTED, NOT_MEASURABLE)),
    Claim("F5", "A hook on the sparse/gating modules, registered before DDP wrapping, that "
          "synchronizes, normalizes the FP16 scale and asserts gradient shapes agree",
          "seed 000 §4.2", f5, (REFUTED, REPRODUCED, NOT_REPRODUCED, NOT_MEASURABLE)),
    Claim("P1", "Refuse NCCL older than 2.13.4 (2.12.x loses 12.7% of allreduces)",
          "seed 000 §5", p1, (REPRODUCED, NOT_REPRODUCED, NOT_MEASURABLE)),
    Claim("P2", "Prometheus exporter of allreduce time per rank/layer; barrier when its std "
          "exceeds 1.5 ms", "seed 000 §5", p2,
          (REPRODUCED, NOT_REPRODUCED, INSIDE_NOISE, NOT_MEASURABLE)),
    Claim("P3", "SparseGradientContract: sparse modules expose their mask entropy",
          "seed 000 §5", p3, (IMPLEMENTED, NOT_IMPLEMENTED, NOT_MEASURABLE)),
    Claim("R1", "Gradient-sync consistency 99.9994% (target ≥ 99.999%)",
          "seed 000 §5 (72-hour run)", r1, (REPRODUCED, NOT_REPRODUCED, NOT_MEASURABLE)),
    Claim("R2", "Per-step AllReduce time CV 0.023 (baseline 0.187)", "seed 000 §5 (72-hour run)",
          r2, (REPRODUCED, NOT_REPRODUCED, INSIDE_NOISE, NOT_MEASURABLE)),
    Claim("R3", "Convergence 2.17× faster: val_loss < 0.86 after 1,842 steps",
          "seed 000 §5 (72-hour run)", r3, (REPRODUCED, NOT_REPRODUCED, NOT_MEASURABLE)),
    Claim("R4", "Peak memory −19.3% (dynamic buckets hold fewer redundant buffers)",
          "seed 000 §5 (72-hour run)", r4, (REPRODUCED, NOT_REPRODUCED, NOT_MEASURABLE)),
    Claim("R5", "NCCL error log lines 42.7/hour → 0.3/hour", "seed 000 §5 (72-hour run)", r5,
          (REPRODUCED, NOT_REPRODUCED, NOT_MEASURABLE)),
    Claim("Q1", "Open: with channel-wise sparsity, should L2-norm bucketing become "
          "KL-divergence-driven alignment?", "seed 000, closing questions", open_question,
          (OPEN_QUESTION,)),
    Claim("Q2", "Open: adapting NCCL parameters across GPU generations in mixed A100+H100 "
          "clusters", "seed 000, closing questions", open_question, (OPEN_QUESTION,)),
    Claim("L1", "The stock single-GPU flow is slow (1M samples > 12 h); long sequences OOM",
          "seed 004, pain points", l1, (REPRODUCED, NOT_REPRODUCED, NOT_MEASURABLE)),
    Claim("L2", "Lightning: DDP with accelerator='gpu', devices=4; AMP with precision=16; "
          "LightningDataModule with dynamic padding; hierarchical model", "seed 004, "
          "Lightning comparison and implementation", l2,
          (IMPLEMENTED, NOT_IMPLEMENTED, NOT_MEASURABLE)),
    Claim("L3", "1 GPU FP32 0.42 s/iter 9.8 GB; 1 GPU AMP 0.31 s/iter 5.2 GB; 4-GPU DDP+AMP "
          "0.08 s/iter 3.7 GB per GPU", "seed 004, benchmark table", l3,
          (REPRODUCED, NOT_REPRODUCED, INSIDE_NOISE, NOT_MEASURABLE)),
    Claim("L4", "seed_everything(42, workers=True); WeightedRandomSampler; FX quantization "
          "(fbgemm) for deployment", "seed 004, pitfalls", l4,
          (IMPLEMENTED, NOT_IMPLEMENTED, NOT_MEASURABLE)),
    Claim("L5", "Training 3.2× faster, memory −47%, accuracy within ±0.5%", "seed 004, outcome",
          l5, (REPRODUCED, NOT_REPRODUCED, INSIDE_NOISE, NOT_MEASURABLE)),
)


def assess(claim: Claim, rec: RunRecord) -> Finding:
    """One claim's finding; absent evidence becomes 'not measurable here (evidence missing)'."""
    try:
        return claim.assess(rec)
    except Missing as exc:
        return Finding(NOT_MEASURABLE, "—", _missing_field(str(exc)), "evidence missing")


def assess_all(rec: RunRecord | Mapping[str, Any]) -> list[tuple[Claim, Finding]]:
    """Every claim's finding, in ledger order; a raw document is validated first."""
    rec = as_record(rec)
    return [(claim, assess(claim, rec)) for claim in CLAIMS]
