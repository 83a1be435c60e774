"""Text 004's claims (training openclaw with PyTorch Lightning): the slow single-device flow,
the Lightning setup, its benchmark table, its pitfalls, and its outcome.

Speed-ups are 1-device fp32 / N-device seconds per iteration at equal global batch, timing, so
judged only when N ≤ cores/GPUs and from per-repeat figures; the setup and pitfalls are
interfaces this suite implements (Lightning run, seeded sampler, int8 model).
"""

from __future__ import annotations

import math
from collections.abc import Callable

from openclaw_ref.reporting.claims.evidence import precision_rows, section
from openclaw_ref.reporting.claims.judging import (
    CMD_LIGHTNING,
    CMD_NCCL4,
    CMD_ONE_GPU_PRECISION,
    HW_4GPU,
    Needs,
    cmd_sections,
    half_effect,
    judge_ratio,
    size_to_judge,
)
from openclaw_ref.reporting.claims.registry import (
    INTERFACE,
    JUDGED,
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


def _one_device_fp32(rows: list[dict]) -> dict | None:
    return next((r for r in rows if r["world_size"] == 1 and r["precision"] == "fp32"), None)


@claim("L1", "The stock single-GPU flow is slow (1M samples > 12 h); long sequences OOM",
       source="text 004, pain points",
       outcomes=JUDGED)
def single_device_flow_is_slow(rec: RunRecord) -> Finding:
    """Needs a GPU. There, extrapolates the 1-device fp32 s/iter to 1M samples: reproduced if
    it exceeds 12 h (for this suite's preset), else not reproduced."""
    ran = "1-device fp32 time per iteration, extrapolated to 1M samples"
    if rec.environment.gpu_count < 1:
        return Finding(Verdict.NOT_MEASURABLE, ran, "no GPU recorded", "needs a GPU",
                       CMD_ONE_GPU_PRECISION)
    one = _one_device_fp32(precision_rows(rec))
    if one is None:
        raise Missing("1-device fp32 row")
    hours = one["s_per_iter"] * 1e6 / rec.config.get("global_batch", 32) / 3600
    return Finding(Verdict.REPRODUCED if hours > 12 else Verdict.NOT_REPRODUCED, ran,
                   f"{hours:.1f} h for 1M samples (text 004: > 12 h; OOM part not measured)")


@claim("L2", "Lightning: DDP with accelerator='gpu', devices=4; AMP with precision=16; "
       "LightningDataModule with dynamic padding; hierarchical model",
       source="text 004, Lightning comparison and implementation", outcomes=INTERFACE)
def lightning_trains_ddp_with_mixed_precision(rec: RunRecord) -> Finding:
    """Implemented if the recorded Lightning run used DDP on ≥ 2 devices with mixed precision
    and trained (steps > 0, finite loss); else not implemented."""
    lt = section(rec, "lightning")
    ok = (lt.get("devices", 0) >= 2 and "ddp" in str(lt.get("strategy", ""))
          and any(p in str(lt.get("precision", "")) for p in ("16", "bf16"))
          and lt.get("steps", 0) > 0 and math.isfinite(lt.get("final_loss", math.nan)))
    return Finding(Verdict.IMPLEMENTED if ok else Verdict.NOT_IMPLEMENTED,
                   f"Lightning Trainer(accelerator={lt.get('accelerator')!r}, "
                   f"devices={lt.get('devices')}, precision={lt.get('precision')!r}, "
                   f"strategy={lt.get('strategy')!r})",
                   f"{lt.get('steps')} steps, {lt.get('steps_per_s', float('nan')):.2f} steps/s, "
                   f"final loss {lt.get('final_loss', float('nan')):.4f}",
                   "" if ok else "the run lacks DDP, mixed precision or training progress",
                   CMD_LIGHTNING)


def _speedup_over_one_device(rec: RunRecord, multi: Callable[[dict], bool], threshold: float,
                             needs: Needs) -> Finding:
    """1-device fp32 / N-device s/iter at equal global batch, from per-repeat figures."""
    rows = precision_rows(rec)
    one = _one_device_fp32(rows)
    many = [r for r in rows if multi(r)]
    if one is None or not many:
        raise Missing("precision rows incomplete")
    best = min(many, key=lambda r: r["s_per_iter"])
    ran = f"text 004's matrix: 1 device fp32 vs {best['label']}"
    shown = f"single figures: {one['s_per_iter'] / best['s_per_iter']:.2f}× speed-up"
    fits = size_to_judge(rec, [best["world_size"]], ran, needs, shown)
    if isinstance(fits, Finding):
        return fits
    a, b = one.get("s_per_iter_repeats") or [], best.get("s_per_iter_repeats") or []
    n = min(len(a), len(b))
    label, reason, text = judge_ratio(a[:n], b[:n], threshold, "speed-up", needs.command)
    if not (a and b):
        reason = missing_field("precision.rows_data[].s_per_iter_repeats")
    return Finding(label, ran, f"{shown}; {text}", reason)


@claim("L3", "1 GPU FP32 0.42 s/iter 9.8 GB; 1 GPU AMP 0.31 s/iter 5.2 GB; 4-GPU DDP+AMP "
       "0.08 s/iter 3.7 GB per GPU", source="text 004, benchmark table", outcomes=TIMED)
def four_gpu_ddp_amp_speedup(rec: RunRecord) -> Finding:
    """Needs 4 GPUs. Judged on 1-GPU fp32 / 4-GPU DDP+AMP s/iter against 3.1 (half text
    004's 0.42 / 0.08 = 5.25×), by bootstrap over repeats."""
    if rec.environment.backend != "nccl" or rec.environment.gpu_count < 4:
        rows = (rec.section("precision") or {}).get("rows_data") or []
        return Finding(Verdict.NOT_MEASURABLE, "text 004's matrix on this machine",
                       "; ".join(f"{r['label']}: {r['s_per_iter']:.3f} s/iter" for r in rows)
                       or "no precision rows", f"needs {HW_4GPU}", CMD_NCCL4)
    return _speedup_over_one_device(
        rec, lambda r: r["world_size"] >= 4 and r["precision"] == "amp",
        half_effect(0.42 / 0.08), Needs(HW_4GPU, CMD_NCCL4))


@claim("L4", "seed_everything(42, workers=True); WeightedRandomSampler; FX quantization "
       "(fbgemm) for deployment", source="text 004, pitfalls", outcomes=INTERFACE)
def seeded_sampling_and_int8_model(rec: RunRecord) -> Finding:
    """Implemented if the recorded Lightning run seeded workers and used the weighted sampler,
    and an int8 model (fbgemm/x86) was measured; not implemented if any part failed. Where text
    004's FX path failed and another int8 method stood in, the reason says what was
    substituted and why."""
    lt, q = section(rec, "lightning"), section(rec, "quantization")
    ok = (bool(lt.get("seed_everything_workers")) and bool(lt.get("weighted_sampler"))
          and "error" not in q and q.get("accuracy_int8") is not None)
    text = (f"seed_everything(workers=True): {bool(lt.get('seed_everything_workers'))}; "
            f"WeightedRandomSampler: {bool(lt.get('weighted_sampler'))}; int8 "
            f"({q.get('backend')}): " + (f"accuracy {q.get('accuracy_fp32')} → "
                                         f"{q.get('accuracy_int8')}, latency "
                                         f"{q.get('latency_fp32_ms')} → {q.get('latency_int8_ms')}"
                                         " ms" if "error" not in q else f"error {q['error']}"))
    substituted = (f"substituted: {q.get('method') or 'another int8 method'} for text 004's FX "
                   f"path, which failed here ({q['fx_error']})" if q.get("fx_error") else "")
    return Finding(Verdict.IMPLEMENTED if ok else Verdict.NOT_IMPLEMENTED, "Lightning pitfalls "
                   "and int8 quantization of the trained model on CPU", text,
                   substituted if ok else "", cmd_sections("lightning", "quantization"))


@claim("L5", "Training 3.2× faster, memory −47%, accuracy within ±0.5%",
       source="text 004, outcome", outcomes=TIMED)
def ddp_speedup_over_one_device(rec: RunRecord) -> Finding:
    """Speed-up of N-device DDP (any precision) over 1-device fp32 at equal global batch, judged
    against 2.1 (half text 004's 3.2×) only when N ≤ cores/GPUs and from ≥ 5 repeats. The
    memory (−47%) and accuracy (±0.5%) parts are not judged (not recorded per run)."""
    return _speedup_over_one_device(rec, lambda r: r["world_size"] > 1, half_effect(3.2),
                                    Needs(f"{HW_4GPU} or ≥ 4 cores", CMD_NCCL4))
