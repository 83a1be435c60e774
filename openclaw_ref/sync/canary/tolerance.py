"""How far apart two probe results are, on a scale that healthy noise cannot make tiny.

A probe result's figures (``canary.probe.ProbeResult.figures``) are, per parameter, its probe
gradient's sum and mass (sum of magnitudes), in float64. The distance between two results is
the largest difference of any figure, divided by the mass of the WHOLE probe gradient (the sum
of every parameter's mass; the larger of the two results'). Never by one parameter's own mass:
a Linear followed by BatchNorm has a bias gradient of ~0, pure rounding noise, and relative to
itself any noise is large — the per-parameter tolerance this replaces named such a rank.

The tolerance (``tolerance``) is what the canary accepts where bitwise comparison cannot hold
(ranks whose fingerprints differ, non-deterministic kernels) and what separates a one-off that
honest noise could produce from one it could not. It depends on the precision the probe
computes in: ``RTOL`` for fp32/fp64, ``RTOL_LOW`` where any of it ran in a 16-bit float
(autocast, 16-bit parameters: one ulp of bf16 is 2^16 times one of fp32). Both are justified
by measurement, not assumed: the largest distance honest non-determinism produced on every
model of the test zoo and the benchmark's, in fp32 and under bf16 autocast, beside the smallest
fault each still catches (``experiments/canary_noise.py``; the table in ``docs/canary.md``).

The reference of a tolerant comparison is the element-wise median of the ranks' figures: with
three or more ranks a faulty rank cannot move it far; with two it is their midpoint, so both
ranks are equally far from it — both or neither is off, and ``vote.suspects_of`` names both.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

RTOL = 1e-5  # fp32: of the whole probe gradient's mass (see the module docstring)
RTOL_LOW = 1e-2  # a probe that computed in bf16/fp16


def tolerance(low_precision: bool) -> float:
    """The tolerance of a probe that computed in a 16-bit float (``low_precision``) or not."""
    return RTOL_LOW if low_precision else RTOL


def mass(figures: Sequence[float]) -> float:
    """The whole probe gradient's mass: the sum of every parameter's."""
    return float(sum(figures[1::2]))


def distance(a: Sequence[float], b: Sequence[float]) -> float:
    """The largest difference of any figure of ``a`` and ``b``, as a fraction of the larger
    whole-gradient mass; 0 for equal figures, ``inf`` where a figure is not finite on one side
    only, or where both masses are 0 but the figures differ."""
    worst = 0.0
    for x, y in zip(a, b):
        if x == y or (math.isnan(x) and math.isnan(y)):
            continue
        if not (math.isfinite(x) and math.isfinite(y)):
            return math.inf
        worst = max(worst, abs(x - y))
    if worst == 0.0:
        return 0.0
    scale = max(abs(mass(a)), abs(mass(b)))
    return worst / scale if scale > 0 else math.inf


def first_apart(a: Sequence[float], b: Sequence[float], rtol: float) -> int | None:
    """The first parameter index whose figures differ by more than ``rtol`` of the larger
    whole-gradient mass (the name an error gives), or None."""
    scale = max(abs(mass(a)), abs(mass(b)))
    for j in range(len(a) // 2):
        for x, y in ((a[2 * j], b[2 * j]), (a[2 * j + 1], b[2 * j + 1])):
            same = x == y or (math.isnan(x) and math.isnan(y))
            if not same and not (math.isfinite(x) and math.isfinite(y)
                                 and abs(x - y) <= rtol * scale):
                return j
    return None


def median(rows: Sequence[Sequence[float]]) -> list[float]:
    """The element-wise median of the ranks' figures (with an even count, the midpoint of the
    two middle values; NaNs left out): the reference a faulty minority cannot move far."""
    table = torch.tensor([list(r) for r in rows], dtype=torch.float64)
    return table.nanquantile(0.5, dim=0).tolist()


def off_ranks(rows: Sequence[Sequence[float]], rtol: float) -> list[int]:
    """The indices of ``rows`` farther than ``rtol`` from their median."""
    if len(rows) < 2:
        return []
    ref = median(rows)
    return [i for i, row in enumerate(rows) if distance(row, ref) > rtol]
