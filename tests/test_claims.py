"""Every ledger rule, driven to each of its declared outcomes by a synthetic run record.

A rule that cannot flip is a defect: ``test_every_declared_outcome_is_exercised`` fails when a
rule declares an outcome no case below reaches, or a case reaches an undeclared one. The
records are minimal dicts validated by ``record.parse_record``, exactly what ``report`` reads.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from openclaw_ref.core.metrics import bootstrap_ratio
from openclaw_ref.reporting.claims import (
    CLAIMS,
    IMPLEMENTED,
    INSIDE_NOISE,
    MIN_REPEATS,
    NOT_IMPLEMENTED,
    NOT_MEASURABLE,
    NOT_REPRODUCED,
    OPEN_QUESTION,
    REFUTED,
    REPRODUCED,
    SETTING,
    SOURCES,
    VERDICTS,
    assess,
    assess_all,
    half_effect,
)
from openclaw_ref.reporting.record import (
    SCHEMA_VERSION,
    RecordError,
    RunRecord,
    load_record,
    parse_record,
)
from openclaw_ref.reporting.render import claims_markdown

# ---------------------------------------------------------------------------------------------
# Synthetic records

CPU2 = {"backend": "gloo", "cpu_count": 2, "gpu_count": 0}
CPU8 = {"backend": "gloo", "cpu_count": 8, "gpu_count": 0}
NCCL8 = {"backend": "nccl", "cpu_count": 32, "gpu_count": 8, "gpu_models": ["A100"],
         "nccl": "2.18.1", "cuda": "12.1"}
NOISY = [0.8, 0.9, 1.0, 1.1, 1.2]  # median 1, interval contains 1 (× a threshold)


def record(sections: dict | None = None, env: dict | None = None) -> RunRecord:
    environment = {"backend": "gloo", "cpu_count": 2, "gpu_count": 0, "gpu_models": [],
                   "nccl": None, "cuda": None, "torch": "2.13.0+cpu", "cpu_model": "test",
                   "git_sha": "0" * 40, "date": "2026-01-01T00:00:00+00:00", **(env or {})}
    doc = {"schema_version": SCHEMA_VERSION,
           "meta": {"environment": environment,
                    "compare_config": {"steps": 40, "global_batch": 32, "repeats": MIN_REPEATS,
                                       "world_sizes": [1, 2]}},
           **(sections or {})}
    return parse_record(json.loads(json.dumps(doc)))  # what a stored file would hold


def run(variant: str, w: int, repeat: int = 0, *, step_ms: float = 50.0, cv: float = 0.1,
        skew: float = 0.0, events: list | None = None, equal: bool = True, checks: int = 100,
        failed_checks: int = 0, norms: tuple[float, float] = (1.0, 1.0),
        presence: bool = True, peak: float = 400.0, scope: str | None = None,
        sync_name: str | None = None) -> dict:
    summary = {"median_step_ms": step_ms, "step_ms_cv": cv, "replicas_equal": equal,
               "peak_memory_mb": [peak] * w,
               "sync": {"steps": 10, "bucket_checks": checks, "checks_run": checks,
                        "checks_passed": checks - failed_checks}}
    if scope:
        summary["peak_memory_scope"] = scope
    return {"variant": variant, "world_size": w, "repeat": repeat, "summary": summary,
            "sync": {"name": sync_name or variant.split()[0]}, "step_ms": [step_ms] * 10,
            "events": events or [], "skew_ms": [skew] * 20,
            "grad_norms": {"layer.3.attn.v_proj.weight": [[norms[0]] + [norms[1]] * (w - 1)] * 10},
            "grad_presence_agrees": [presence] * 10,
            "sync_last": {"buckets": [{"ready_ms": [1.0 + i for i in range(w)]}]}}


def failed(variant: str, w: int, repeat: int = 0, kind: str | None = None) -> dict:
    r = {"variant": variant, "world_size": w, "repeat": repeat, "error": "boom",
         "sync": {"name": variant.split()[0]}}
    if kind:
        r["stopped_by"] = {"kind": kind, "step": 0, "ranks": [1]}
    return r


def strategies(*runs: dict, **extra) -> dict:
    return {"strategies": {"runs": list(runs), **extra}}


def repeats(variant: str, w: int, values: list[float], field: str = "step_ms", **kw) -> list:
    return [run(variant, w, i, **{field: v}, **kw) for i, v in enumerate(values)]


def curve(loss: list[float] | None = None, validation: list[dict] | None = None,
          sparsity: list[float] | None = None, entropy: list[float] | None = None,
          equal: bool = True, events: list | None = None) -> dict:
    n = 300
    return {"world_size": 2, "loss": loss or [1.0] * n,
            "validation": validation or [{"step": s, "loss": 2.0 - s / 300}
                                         for s in range(0, n, 2)],
            "realized_sparsity": sparsity or [0.12 + 0.56 * (i % 11) / 10 for i in range(n)],
            "mask_entropy_bits": entropy if entropy is not None else [0.9] * n,
            "grad_norms": {"layer.3.attn.v_proj.weight": [], "layer.5.ffn.w1.weight": []},
            "summary": {"replicas_equal": equal}, "events": events or []}


def curves(**kw) -> dict:
    return {"curves": {"ddp": curve(**kw), "hardened fp32": curve()}}


def spiky_validation(period: int) -> list[dict]:
    return [{"step": s, "loss": 1.5 if s % period == 0 and s else 1.0} for s in range(0, 300, 2)]


def faults(cases: list[dict] | None = None, alignment: list[dict] | None = None,
           late: str = "250ms") -> dict:
    return {"faults": {"cases": cases or [], "bucket_alignment": alignment or [],
                       "settings": {"late_rank_value": late}}}


def case(fault: str, strategy: str, outcome: str, detail: str = "", kind: str = "") -> dict:
    return {"fault_name": fault, "strategy": strategy, "outcome": outcome, "detail": detail,
            "kind": kind, "cell": outcome}


def overflow(base: float, seed: float, workload: str = "harsh", w: int = 2) -> dict:
    def row(strategy: str, scale: str, rate: float) -> dict:
        return {"strategy": strategy, "scale": scale, "wire": "fp16", "workload": workload,
                "world_size": w, "overflow_rate": rate, "skipped_steps": 0, "steps": 8}

    return {"overflow": {"rates": [row("ddp-fp16", "4096", base),
                                   row("hardened-fp16", "4096", seed),
                                   row("hardened-fp16-auto", "auto", 0.0)]}}


def scale_mismatch(w: int, allreduces: int, overflowed: int, corrupted: int,
                   uniform: int = 0) -> dict:
    return {"overflow": {"scale_mismatch": [{"world_size": w, "allreduces": allreduces,
                                             "overflowed": overflowed, "corrupted": corrupted,
                                             "overflowed_uniform": uniform}]}}


def sparsity_ablation(on: float, off: float, w: int = 2) -> dict:
    return {"ablations": {"sparsity": {
        "sparse (seed range)": {"world_size": w, "bucket_steps": 100, "share_over_3ms": on},
        "masking off (s = 0)": {"world_size": w, "bucket_steps": 100, "share_over_3ms": off}}}}


def barrier(off: list[float], on: list[float], w: int = 2, per_repeat: bool = True) -> dict:
    rows = [{"arm": arm, "world_size": w, "median_step_ms": v[0], "barriers": 3, "steps": 40}
            for arm, v in (("off", off), ("on", on))]
    reps = {"off": [{"median_step_ms": v} for v in off], "on": [{"median_step_ms": v} for v in on]}
    return {"ablations": {"skew_barrier": rows, **({"skew_barrier_repeats": reps}
                                                    if per_repeat else {})}}


def precision(one: list[float], many: list[float], w: int, prec: str = "amp") -> dict:
    return {"precision": {"rows_data": [
        {"label": "1 rank fp32", "world_size": 1, "precision": "fp32", "s_per_iter": one[0],
         "s_per_iter_repeats": one},
        {"label": f"{w} ranks DDP+{prec}", "world_size": w, "precision": prec,
         "s_per_iter": many[0], "s_per_iter_repeats": many}]}}


def lightning(ok: bool = True) -> dict:
    return {"devices": 2 if ok else 1, "accelerator": "cpu", "precision": "bf16-mixed",
            "strategy": "ddp", "steps": 10, "steps_per_s": 3.0, "final_loss": 0.5,
            "seed_everything_workers": ok, "weighted_sampler": True}


QUANT = {"backend": "x86", "accuracy_fp32": 0.91, "accuracy_int8": 0.905,
         "latency_fp32_ms": 2.0, "latency_int8_ms": 1.2}


def hardened_paired(ddp_cv: list[float], hard_cv: list[float], w: int = 2) -> dict:
    return strategies(*repeats("ddp", w, ddp_cv, "cv"), *repeats("hardened fp32", w, hard_cv, "cv"))


def f2_runs(static: list[float], seed: list[float], w: int = 2) -> dict:
    return strategies(*repeats("bucketed static", w, static),
                      *repeats("bucketed norm-ema (seed F2)", w, seed))


def f5(none: str, caught: tuple[str, ...]) -> dict:
    names = ("none", "scale-mismatch", "local-buckets", "permuted-params")
    return faults([case(f, "seed-f5", none if f == "none" else
                        "detected" if f in caught else "silent-corruption") for f in names])


def fails(variant: str, n: int) -> list[dict]:
    return [failed(variant, 2, i) for i in range(n)]


# (claim id, case name, record factory, expected label)
CASES: list[tuple[str, str, Callable[[], RunRecord], str]] = [
    ("S1", "any environment", lambda: record(), SETTING),
    ("S2", "seed range and names", lambda: record(curves()), IMPLEMENTED),
    ("S2", "constant sparsity", lambda: record(curves(sparsity=[0.3] * 300)), NOT_IMPLEMENTED),
    ("S2", "no curves", lambda: record(), NOT_MEASURABLE),
    ("C1", "spikes every 40 steps", lambda: record(curves(validation=spiky_validation(40))),
     REPRODUCED),
    ("C1", "monotone validation", lambda: record(curves()), NOT_REPRODUCED),
    ("C1", "curve too short", lambda: record(curves(validation=spiky_validation(40)[:20])),
     NOT_MEASURABLE),
    ("C2", "rank norms 3× apart", lambda: record(strategies(run("ddp", 2, norms=(1.0, 3.0)))),
     REPRODUCED),
    ("C2", "rank norms 10% apart", lambda: record(strategies(run("ddp", 2, norms=(1.0, 1.1)))),
     NOT_REPRODUCED),
    ("C2", "one rank only", lambda: record(strategies(run("ddp", 1))), NOT_MEASURABLE),
    ("C3", "10 ms skew", lambda: record(strategies(*repeats("hardened fp32", 2, [10.0] * 5,
                                                              "skew"))), REPRODUCED),
    ("C3", "0.5 ms skew", lambda: record(strategies(*repeats("hardened fp32", 2, [0.5] * 5,
                                                               "skew"))), NOT_REPRODUCED),
    ("C3", "skew around 3 ms", lambda: record(strategies(*repeats(
        "hardened fp32", 2, [3 * x for x in NOISY], "skew"))), INSIDE_NOISE),
    ("C3", "p99 recorded per run", lambda: record(strategies(*[
        {**run("hardened fp32", 2, i), "skew_ms": None, "skew_p99_ms": 10.0} for i in range(5)])),
     REPRODUCED),
    ("C3", "4 ranks on 2 cores", lambda: record(strategies(*repeats("hardened fp32", 4, [10.0] * 5,
                                                                      "skew"))), NOT_MEASURABLE),
    ("C3", "3 repeats", lambda: record(strategies(*repeats("hardened fp32", 2, [10.0] * 3,
                                                             "skew"))), NOT_MEASURABLE),
    ("C4", "skew follows the sparse path", lambda: record(sparsity_ablation(0.9, 0.1)), REPRODUCED),
    ("C4", "skew without the sparse path", lambda: record(sparsity_ablation(0.99, 0.98)),
     NOT_REPRODUCED),
    ("C4", "ablation on 4 ranks, 2 cores", lambda: record(sparsity_ablation(0.9, 0.1, w=4)),
     NOT_MEASURABLE),
    ("C5", "shape mismatches", lambda: record(strategies(run(
        "hardened fp32", 2, events=[{"kind": "ShapeMismatch", "step": 1}]))), REPRODUCED),
    ("C5", "presence differs, shapes never", lambda: record(strategies(
        run("hardened fp32", 2), run("ddp", 2, presence=False))), REFUTED),
    ("C5", "nothing differs", lambda: record(strategies(run("hardened fp32", 2), run("ddp", 2))),
     NOT_REPRODUCED),
    ("C5", "no hardened multi-rank run", lambda: record(strategies(run("ddp", 2))),
     NOT_MEASURABLE),
    ("C6", "gloo", lambda: record(strategies(run("ddp", 2))), NOT_MEASURABLE),
    ("C6", "fails without synchronize", lambda: record(strategies(
        run("ddp", 2), cuda_sync_ablation={"with": {"collectives": 1000, "failed": 0},
                                           "without": {"collectives": 1000, "failed": 80}}),
        NCCL8), REPRODUCED),
    ("C6", "never fails", lambda: record(strategies(
        run("ddp", 2), cuda_sync_ablation={"with": {"collectives": 1000, "failed": 0},
                                           "without": {"collectives": 1000, "failed": 0}}),
        NCCL8), NOT_REPRODUCED),
    ("C7", "proxy shown", lambda: record(strategies(run("hardened fp32", 2))), NOT_MEASURABLE),
    ("M1", "late rank misaligns buckets", lambda: record(faults([case(
        "late-rank", "ddp", "detected", kind="BucketMisalignment")])), REPRODUCED),
    ("M1", "no shift at 250 ms", lambda: record(faults([case("late-rank", "ddp", "no-effect")]))
     , REFUTED),
    ("M1", "no shift at 1 ms", lambda: record(faults([case("late-rank", "ddp", "no-effect")],
                                                      late="1ms")), NOT_REPRODUCED),
    ("M1", "no fault matrix", lambda: record(), NOT_MEASURABLE),
    ("M2", "proxy shown", lambda: record(curves()), NOT_MEASURABLE),
    ("M3", "layouts differ", lambda: record(faults(alignment=[
        {"strategy": "ddp", "world_size": 2, "aligned": False, "steps": 6}])), REPRODUCED),
    ("M3", "layouts identical", lambda: record(faults(alignment=[
        {"strategy": "ddp", "world_size": 2, "aligned": True, "steps": 6}])), REFUTED),
    ("M3", "not recorded", lambda: record(faults()), NOT_MEASURABLE),
    ("M4", "overflows at 8 ranks", lambda: record(scale_mismatch(8, 100, 5, 5)), REPRODUCED),
    ("M4", "corrupts silently", lambda: record(scale_mismatch(8, 100, 0, 10)), REFUTED),
    ("M4", "rarely overflows", lambda: record(scale_mismatch(8, 1000, 1, 0)), NOT_REPRODUCED),
    ("M4", "2 ranks only", lambda: record(scale_mismatch(2, 100, 5, 5)), NOT_MEASURABLE),
    ("M4", "overflow the uniform control has too", lambda: record(
        scale_mismatch(8, 120, 44, 120, uniform=46)), REFUTED),
    ("M4", "no uniform control recorded", lambda: record({"overflow": {"scale_mismatch": [
        {"world_size": 8, "allreduces": 10, "overflowed": 5, "corrupted": 5}]}}), NOT_MEASURABLE),
    ("F1", "baseline never fails", lambda: record(strategies(run("ddp", 2),
                                                             run("hardened fp32", 2))),
     NOT_MEASURABLE),
    ("F1", "hardened removes failures", lambda: record(strategies(
        *fails("ddp", 2), run("ddp", 2, 3), run("hardened fp32", 2))), REPRODUCED),
    ("F1", "hardened fails as often", lambda: record(strategies(
        run("ddp", 2, equal=False), run("hardened fp32", 2, equal=False))), NOT_REPRODUCED),
    ("F2", "seed planner misaligns", lambda: record(strategies(
        failed("bucketed norm-ema (seed F2)", 2, kind="BucketMisalignment"))), REFUTED),
    ("F2", "seed planner 1.5× faster", lambda: record(f2_runs([60.0] * 5, [40.0] * 5)),
     REPRODUCED),
    ("F2", "seed planner as fast", lambda: record(f2_runs([40.0] * 5, [40.0] * 5)),
     NOT_REPRODUCED),
    ("F2", "gain inside the noise", lambda: record(f2_runs(
        [40 * half_effect(1.372) * x for x in NOISY], [40.0] * 5)), INSIDE_NOISE),
    ("F2", "4 ranks on 2 cores", lambda: record(f2_runs([60.0] * 5, [40.0] * 5, w=4)),
     NOT_MEASURABLE),
    ("F3", "uniform scale overflows more", lambda: record(overflow(0.0, 0.0008)), REFUTED),
    ("F3", "uniform scale cuts overflow", lambda: record(overflow(0.01, 0.0001)), REPRODUCED),
    ("F3", "cuts, not to 0.017%", lambda: record(overflow(0.01, 0.005)), NOT_REPRODUCED),
    ("F3", "baseline never overflows", lambda: record(overflow(0.0, 0.0)), NOT_MEASURABLE),
    ("F4", "lint error", lambda: record({"doctor": {"findings": [
        {"level": "error", "variable": "NCCL_RING_ALGO", "replacement": "NCCL_ALGO=Ring"}]}}),
     REFUTED),
    ("F4", "names valid", lambda: record({"doctor": {"findings": [
        {"level": "warning", "variable": "NCCL_MIN_NRINGS", "replacement": "x"}]}}),
     NOT_MEASURABLE),
    ("F5", "breaks a clean run", lambda: record(f5("crash", ())), REFUTED),
    ("F5", "catches scale and layout", lambda: record(f5("no-effect", (
        "scale-mismatch", "local-buckets"))), REPRODUCED),
    ("F5", "catches nothing", lambda: record(f5("no-effect", ())), NOT_REPRODUCED),
    ("F5", "hook not run", lambda: record(faults()), NOT_MEASURABLE),
    ("P1", "no NCCL", lambda: record(), NOT_MEASURABLE),
    ("P1", "2.12 loses allreduces", lambda: record({"doctor": {"nccl_versions": [
        {"nccl": "2.12.12", "allreduces": 1000, "lost": 100},
        {"nccl": "2.18.1", "allreduces": 1000, "lost": 0}]}}, NCCL8), REPRODUCED),
    ("P1", "2.12 loses little", lambda: record({"doctor": {"nccl_versions": [
        {"nccl": "2.12.12", "allreduces": 1000, "lost": 1},
        {"nccl": "2.18.1", "allreduces": 1000, "lost": 0}]}}, NCCL8), NOT_REPRODUCED),
    ("P2", "barrier speeds steps", lambda: record(barrier([40.0] * 5, [30.0] * 5)), REPRODUCED),
    ("P2", "barrier slows steps", lambda: record(barrier([30.0] * 5, [40.0] * 5)),
     NOT_REPRODUCED),
    ("P2", "inside the noise", lambda: record(barrier([30 * x for x in NOISY], [30.0] * 5)),
     INSIDE_NOISE),
    ("P2", "no per-repeat arms", lambda: record(barrier([40.0] * 5, [30.0] * 5,
                                                        per_repeat=False)), NOT_MEASURABLE),
    ("P3", "entropy every step", lambda: record(curves()), IMPLEMENTED),
    ("P3", "entropy not finite", lambda: record({"curves": {"x": curve(
        entropy=[float("nan")] * 300)}}), NOT_IMPLEMENTED),
    ("P3", "no curves", lambda: record(), NOT_MEASURABLE),
    ("R1", "400k checks pass", lambda: record(strategies(run("hardened fp32", 2,
                                                             checks=400_000))), REPRODUCED),
    ("R1", "1% of checks fail", lambda: record(strategies(run("hardened fp32", 2, checks=1000,
                                                              failed_checks=10))),
     NOT_REPRODUCED),
    ("R1", "too few checks", lambda: record(strategies(run("hardened fp32", 2, checks=5000))),
     NOT_MEASURABLE),
    ("R2", "CV 10× lower", lambda: record(hardened_paired([0.5] * 5, [0.05] * 5)), REPRODUCED),
    ("R2", "CV equal", lambda: record(hardened_paired([0.1] * 5, [0.1] * 5)), NOT_REPRODUCED),
    ("R2", "inside the noise", lambda: record(hardened_paired(
        [0.1 * half_effect(0.187 / 0.023) * x for x in NOISY], [0.1] * 5)), INSIDE_NOISE),
    ("R2", "3 repeats", lambda: record(hardened_paired([0.5] * 3, [0.05] * 3)), NOT_MEASURABLE),
    ("R3", "baseline consistent", lambda: record(curves()), NOT_MEASURABLE),
    ("R3", "fix converges 4× sooner", lambda: record({"curves": {
        "ddp": curve(validation=[{"step": s, "loss": 2.0 - s / 100} for s in range(0, 300, 2)],
                     equal=False),
        "hardened fp32": curve(validation=[{"step": s, "loss": 2.0 - s / 25}
                                           for s in range(0, 300, 2)])}}), REPRODUCED),
    ("R3", "same convergence", lambda: record(curves(equal=False)), NOT_REPRODUCED),
    ("R4", "fix peaks 25% lower", lambda: record(strategies(
        run("ddp", 2, peak=400, scope="run"), run("hardened fp32", 2, peak=300, scope="run"))),
     REPRODUCED),
    ("R4", "same peak", lambda: record(strategies(
        run("ddp", 2, peak=400, scope="run"), run("hardened fp32", 2, peak=400, scope="run"))),
     NOT_REPRODUCED),
    ("R4", "per-process peaks only", lambda: record(strategies(
        run("ddp", 2, peak=400), run("hardened fp32", 2, peak=300))), NOT_MEASURABLE),
    ("R5", "gloo", lambda: record(), NOT_MEASURABLE),
    ("R5", "errors drop", lambda: record(strategies(run("ddp", 2), nccl_log={
        "baseline_per_hour": 40.0, "fixed_per_hour": 1.0}), NCCL8), REPRODUCED),
    ("R5", "errors stay", lambda: record(strategies(run("ddp", 2), nccl_log={
        "baseline_per_hour": 40.0, "fixed_per_hour": 39.0}), NCCL8), NOT_REPRODUCED),
    ("Q1", "open", lambda: record(), OPEN_QUESTION),
    ("Q2", "open", lambda: record(), OPEN_QUESTION),
    ("L1", "no GPU", lambda: record(), NOT_MEASURABLE),
    ("L1", "slow on a GPU", lambda: record(precision([2.0], [0.5], 4), NCCL8), REPRODUCED),
    ("L1", "fast on a GPU", lambda: record(precision([0.01], [0.005], 4), NCCL8),
     NOT_REPRODUCED),
    ("L2", "DDP + mixed precision", lambda: record({"lightning": lightning()}), IMPLEMENTED),
    ("L2", "one device", lambda: record({"lightning": lightning(ok=False)}), NOT_IMPLEMENTED),
    ("L2", "not run", lambda: record(), NOT_MEASURABLE),
    ("L3", "no GPUs", lambda: record(precision([0.4] * 5, [0.1] * 5, 4)), NOT_MEASURABLE),
    ("L3", "seed's 5.25×", lambda: record(precision([0.42] * 5, [0.08] * 5, 4), NCCL8),
     REPRODUCED),
    ("L3", "no speed-up", lambda: record(precision([0.1] * 5, [0.1] * 5, 4), NCCL8),
     NOT_REPRODUCED),
    ("L3", "inside the noise", lambda: record(precision(
        [half_effect(5.25) * x for x in NOISY], [1.0] * 5, 4), NCCL8), INSIDE_NOISE),
    ("L4", "all three", lambda: record({"lightning": lightning(), "quantization": QUANT}),
     IMPLEMENTED),
    ("L4", "int8 failed", lambda: record({"lightning": lightning(),
                                          "quantization": {"error": "no fbgemm"}}),
     NOT_IMPLEMENTED),
    ("L4", "not run", lambda: record({"lightning": lightning()}), NOT_MEASURABLE),
    ("L5", "4 ranks on 2 cores", lambda: record(precision([0.4] * 5, [0.1] * 5, 4, "fp32")),
     NOT_MEASURABLE),
    ("L5", "4× on 4 cores", lambda: record(precision([0.4] * 5, [0.1] * 5, 4, "fp32"), CPU8),
     REPRODUCED),
    ("L5", "1.2× on 4 cores", lambda: record(precision([0.12] * 5, [0.1] * 5, 4), CPU8),
     NOT_REPRODUCED),
    ("L5", "inside the noise", lambda: record(precision(
        [half_effect(3.2) * x for x in NOISY], [1.0] * 5, 4), CPU8), INSIDE_NOISE),
]

BY_ID = {c.id: c for c in CLAIMS}


@pytest.mark.parametrize(("claim_id", "name", "make", "expected"), CASES,
                         ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_rule_reaches_outcome(claim_id, name, make, expected):
    finding = assess(BY_ID[claim_id], make())
    assert finding.label == expected, finding
    assert finding.measured and finding.command


def test_every_declared_outcome_is_exercised():
    reached: dict[str, set[str]] = {}
    for claim_id, _, _, expected in CASES:
        reached.setdefault(claim_id, set()).add(expected)
    for claim in CLAIMS:
        assert set(claim.outcomes) <= set(VERDICTS), claim.id
        assert reached.get(claim.id) == set(claim.outcomes), claim.id


def test_settings_and_interfaces_are_never_reproduced():
    for claim_id in ("S1", "S2", "P3"):
        assert REPRODUCED not in BY_ID[claim_id].outcomes


def test_every_claim_names_its_seed_source():
    assert len({c.id for c in CLAIMS}) == len(CLAIMS) == 33
    for claim in CLAIMS:
        assert claim.text and any(claim.source.startswith(doc) for doc in SOURCES), claim.id


def test_an_empty_record_is_honest():
    """No section ran: every verdict is a label from the vocabulary; nothing is reproduced."""
    for claim, finding in assess_all(record()):
        assert finding.label in claim.outcomes, claim.id
        assert finding.label not in (REPRODUCED, NOT_REPRODUCED, REFUTED), claim.id


def test_hardware_verdicts_name_the_hardware_and_a_command():
    rec = record(strategies(*repeats("hardened fp32", 4, [10.0] * 5, "skew")))
    found = {c.id: f for c, f in assess_all(rec)}
    assert "≥ 8 cores" in found["C3"].reason and "--backend nccl" in found["C3"].command
    assert "NCCL" in found["R5"].reason and "NCCL" in found["C6"].reason


def test_insufficient_repeats_say_how_many_and_what_to_run():
    f = assess(BY_ID["R2"], record(hardened_paired([0.5] * 3, [0.05] * 3)))
    assert "insufficient repeats: 3 < 5" in f.reason and "--repeats 5" in f.reason


def test_verdicts_are_identical_across_renders():
    rec = record({**curves(), **f2_runs([40 * x for x in NOISY], [40.0] * 5)})
    assert assess_all(rec) == assess_all(rec)


# ---------------------------------------------------------------------------------------------
# The bootstrap interval


def test_bootstrap_is_seeded_and_brackets_a_noisy_ratio():
    num, den = [1.0, 1.3, 0.9, 1.2, 1.1], [1.0] * 5
    first, again = bootstrap_ratio(num, den), bootstrap_ratio(num, den)
    assert first == again
    assert first.low <= first.point <= first.high and first.n == 5
    assert bootstrap_ratio([2.0] * 5, [1.0] * 5).low == 2.0


def test_bootstrap_rejects_unpaired_samples():
    with pytest.raises(ValueError):
        bootstrap_ratio([1.0, 2.0], [1.0])


# ---------------------------------------------------------------------------------------------
# The run record


def test_a_version_1_record_is_read_unchanged(tmp_path):
    doc = json.loads(json.dumps(record().doc))
    del doc["schema_version"]
    path = tmp_path / "cpu2-gloo" / "raw.json"
    path.parent.mkdir()
    path.write_text(json.dumps(doc))
    rec = load_record(path)
    assert rec.upgraded_from == 1 and rec.source == "cpu2-gloo"
    assert f"record schema 1, read as {SCHEMA_VERSION}" in claims_markdown(rec, "results/cpu2-gloo")


@pytest.mark.parametrize(("doc", "message"), [
    ({"schema_version": 99, "meta": {}}, "schema_version 99"),
    ({"foo": 1}, "no schema_version"),
    ([1, 2], "not a JSON object"),
])
def test_a_foreign_record_fails_with_a_clear_message(doc, message):
    with pytest.raises(RecordError, match=message) as info:
        parse_record(doc)
    assert "openclaw-bench compare" in str(info.value)


def test_a_malformed_run_is_named():
    doc = json.loads(json.dumps(record().doc))
    doc["strategies"] = {"runs": [{"variant": "ddp", "world_size": "2", "repeat": 0}]}
    with pytest.raises(RecordError, match=r"strategies.runs\[0\]"):
        parse_record(doc)


def test_the_ledger_says_where_it_was_rendered_from():
    md = claims_markdown(record(), "results/cpu2-gloo")
    assert "Rendered from `results/cpu2-gloo/raw.json`" in md
    assert "shared/" not in md and "## Sources" in md
