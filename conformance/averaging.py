"""The bucket average: what a comm hook returned for a bucket, against what it was handed.

DDP's promise for every bucket is the average of the ranks' buckets, ȳ = (1/W) Σ_k g_k, on
every rank. Given each rank's bucket before the hook (g_k, cloned at the hook's entry) and the
hook's result on each rank (y_r), this is checked directly, and a wrong result is attributed:

  - some ranks got ȳ and others did not: the others are named (their result is not the
    average — e.g. a rank that kept its own gradient);
  - every rank got the same wrong result: it is fitted as Σ_k w_k g_k (least squares, float64).
    A good fit with w_k ≠ 1/W names the ranks whose contribution is weighted wrong (one rank
    scaled: that rank; no division by W: every rank); a bad fit means the elements were moved
    or mixed (a bucket unpacked in another order): every rank is named.

Bound (derived, not tuned): the wire rounds each element once per cast and once per addition,
so a correct result is within (W + 2)·u·s + 2W·δ of ȳ, with u the wire's unit roundoff (fp32
2^-24, fp16 2^-11, bf16 2^-8; native: the gradients' own dtype), s the largest |g_k| element
of the bucket and δ the wire's smallest subnormal step (gradual underflow). A result off by
more is not an average of these buckets on this wire.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from openclaw_ref.sync.base import Wire

WIRE_DTYPES = {Wire.FP32: torch.float32, Wire.FP16: torch.float16, Wire.BF16: torch.bfloat16}
WEIGHT_SLACK = 1e-3  # a fitted weight within this of 1/W (relative) counts as 1/W


@dataclass(frozen=True)
class AverageFault:
    """The first bucket whose result is not the average: where, whom, and how."""

    step: int
    bucket: int
    ranks: list[int]
    detail: str
    error: float  # max |y − ȳ| over the named ranks
    bound: float
    weights: list[float] | None = None


def wire_dtype(wire: Wire, grads: torch.dtype) -> torch.dtype:
    return grads if wire is Wire.NATIVE else WIRE_DTYPES[wire]


def bound(wire_dt: torch.dtype, world_size: int, scale: float) -> float:
    """The rounding a correct average may carry (see the module docstring)."""
    info = torch.finfo(wire_dt)
    unit = info.eps / 2
    return (world_size + 2) * unit * scale + 2 * world_size * info.tiny * info.eps


def _dense(t: torch.Tensor) -> torch.Tensor:
    return (t.to_dense() if t.is_sparse else t).double().reshape(-1)


def check_bucket(step: int, index: int, locals_: list[torch.Tensor],
                 results: list[torch.Tensor], wire: Wire) -> AverageFault | None:
    """One bucket at one step: every rank's local bucket and every rank's result."""
    world = len(locals_)
    grads = torch.stack([_dense(g) for g in locals_])  # W × n
    mean = grads.mean(0)
    scale = float(grads.abs().max()) if grads.numel() else 0.0
    limit = bound(wire_dtype(wire, locals_[0].dtype), world, scale)
    errors = [float((_dense(y) - mean).abs().max()) if mean.numel() else 0.0 for y in results]
    off = [r for r, e in enumerate(errors) if not e <= limit]
    if not off:
        return None
    worst = max((errors[r] for r in off), default=0.0)
    if len(off) < world:
        own = [r for r in off if float((_dense(results[r]) - grads[r]).abs().max()) <= limit]
        how = ("it equals that rank's own bucket, un-reduced" if own == off
               else "it is not the average of the ranks' buckets")
        return AverageFault(step, index, off, f"ranks {off} got another result than the "
                            f"others: {how}", worst, limit)
    return _fitted(step, index, grads, _dense(results[0]), limit, worst)


def _fitted(step: int, index: int, grads: torch.Tensor, result: torch.Tensor, limit: float,
            worst: float) -> AverageFault:
    """Every rank got the same wrong result: fit it as a weighted sum of the local buckets."""
    world = grads.shape[0]
    weights = torch.linalg.lstsq(grads.T, result.unsqueeze(1), driver="gelsd").solution
    weights = weights.reshape(-1)
    residual = float((grads.T @ weights - result).abs().max())
    fitted = [round(float(w), 6) for w in weights]
    if not residual <= limit:
        return AverageFault(step, index, list(range(world)), "the result is not a weighted sum "
                            "of the ranks' buckets: its elements were moved or mixed", worst,
                            limit, fitted)
    wrong = [k for k, w in enumerate(fitted) if abs(w * world - 1) > WEIGHT_SLACK]
    if not wrong:  # ranks with equal buckets: the fit cannot tell their weights apart
        wrong = list(range(world))
    shown = ", ".join(f"{w:.3g}" for w in fitted)
    return AverageFault(step, index, wrong, f"the result is Σ w_k·g_k with w = [{shown}] "
                        f"instead of 1/{world} each: ranks {wrong} weighted wrong", worst,
                        limit, fitted)


def first_fault(per_rank: list[list[list[tuple[int, torch.Tensor, torch.Tensor]]]],
                wire: Wire) -> tuple[AverageFault | None, int]:
    """The first bucket (by step, then index) that is not the average, and how many buckets
    were checked. ``per_rank[r][step]`` is rank r's [(index, local, result), …]; a bucket
    missing on some rank is left to the bucket-layout check."""
    checked = 0
    steps = min((len(x) for x in per_rank), default=0)
    for step in range(steps):
        by_rank = [{i: (g, y) for i, g, y in x[step]} for x in per_rank]
        for index in sorted(set.intersection(*(set(b) for b in by_rank))):
            pairs = [b[index] for b in by_rank]
            fault = check_bucket(step, index, [g for g, _ in pairs], [y for _, y in pairs],
                                 wire)
            checked += 1
            if fault is not None:
                return fault, checked
    return None, checked
