"""Synthetic run records for the ledger's rule tests, and the checks every case file shares.

The records are minimal dicts validated by ``record.parse_record``, exactly what ``report``
reads; each builder makes one section (or one run) with the fields the rules read.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from openclaw_ref.reporting.claims import CLAIMS, Claim, Verdict, assess
from openclaw_ref.reporting.claims.judging import MIN_REPEATS
from openclaw_ref.reporting.record import SCHEMA_VERSION, RunRecord, parse_record

# (claim id, case name, record factory, expected label)
Case = tuple[str, str, Callable[[], RunRecord], Verdict]
BY_ID: dict[str, Claim] = {c.id: c for c in CLAIMS}

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
        "sparse (text 000's range)": {"world_size": w, "bucket_steps": 100, "share_over_3ms": on},
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


def hardened_paired(ddp_cv: list[float], hard_cv: list[float], w: int = 2,
                    ddp_failed: bool = True) -> dict:
    """Paired CVs; by default ddp's replicas diverged (a sync failure for the fix to steady)."""
    return strategies(*repeats("ddp", w, ddp_cv, "cv", equal=not ddp_failed),
                      *repeats("hardened fp32", w, hard_cv, "cv"))


def f2_runs(static: list[float], seed: list[float], w: int = 2) -> dict:
    return strategies(*repeats("bucketed static", w, static),
                      *repeats("bucketed norm-ema (text 000's F2)", w, seed))


def seed_hook_cases(none: str, caught: tuple[str, ...]) -> dict:
    names = ("none", "scale-mismatch", "local-buckets", "permuted-params")
    return faults([case(f, "seed-f5", none if f == "none" else
                        "detected" if f in caught else "silent-corruption") for f in names])


def fails(variant: str, n: int) -> list[dict]:
    return [failed(variant, 2, i) for i in range(n)]


def case_ids(cases: list[Case]) -> list[str]:
    return [f"{c[0]}-{c[1]}" for c in cases]


def assert_reaches(claim_id: str, rec: RunRecord, expected: Verdict) -> None:
    """The claim's rule, on ``rec``, returns ``expected`` and says what it measured and how."""
    finding = assess(BY_ID[claim_id], rec)
    assert finding.label == expected, finding
    assert finding.measured
    # a command always writes the raw.json the verdict reads, or there is nothing to regenerate
    assert finding.command == "" or finding.command.startswith("openclaw-bench compare"), finding
