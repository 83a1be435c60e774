"""The compute canary's fallback where the ranks are not bitwise reproducible (the start-up
self-test found their probes differ: other thread counts, CPU types or devices, or
non-deterministic kernels): each probe's gradients are compared within a stated tolerance.

Per parameter, two float64 figures of its probe gradient: the sum and the sum of magnitudes
(the gradient's *mass*). The reference is the rank holding the median mass (the lower median:
with two ranks, the smaller); a rank is named when either figure differs from the reference's by
more than ``RTOL`` of its mass, or is not finite. Reduction-order differences between
heterogeneous ranks move these figures by ~1e-7 of the mass; a flipped exponent bit or a wrong
row of a matmul moves them by far more than ``RTOL`` — but a 1-ulp error of one element (and
anything else below ``RTOL`` of a gradient's mass) can no longer be seen. The figures of every
rank are gathered (one collective per probe, in the settle of the step after the probe, where
every rank is by construction).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

RTOL = 1e-3  # of a gradient's mass (the sum of its magnitudes)


def fingerprints(grads: Sequence[torch.Tensor | None], device: torch.device) -> torch.Tensor:
    """(1 + 2·P,) float64 on ``device``: 1 (probed), then each parameter's probe-gradient sum
    and mass (0, 0 for one without a gradient)."""
    parts = [torch.ones(1, dtype=torch.float64, device=device)]
    for g in grads:
        if g is None:
            parts.append(torch.zeros(2, dtype=torch.float64, device=device))
        else:
            d = g.detach().to(torch.float64)
            parts.append(torch.stack([d.sum(), d.abs().sum()]).to(device))
    return torch.cat(parts)


def not_probed(params: int, device: torch.device) -> torch.Tensor:
    """The row of a rank whose probe did not run: 0, left out of the comparison."""
    return torch.zeros(1 + 2 * params, dtype=torch.float64, device=device)


def outliers(rows: Sequence[Sequence[float]], rtol: float = RTOL) -> tuple[list[int], int | None]:
    """(the ranks whose figures are off, the first parameter index where some rank is) among
    the ranks that probed (a row's first element: 1 if it did, then its figures)."""
    ranks = [r for r, row in enumerate(rows) if row and row[0] == 1.0]
    rows = [row[1:] for row in rows]
    if len(ranks) < 2:
        return [], None
    off: set[int] = set()
    first = None
    for j in range(len(rows[ranks[0]]) // 2):
        ref = _median_rank([(rows[r][2 * j + 1], r) for r in ranks])
        if ref is None:  # no rank's is finite: nothing to compare (the NaN check's case)
            continue
        ref_sum, ref_mass = rows[ref][2 * j], rows[ref][2 * j + 1]
        bound = rtol * abs(ref_mass)
        bad = [r for r in ranks if not (abs(rows[r][2 * j] - ref_sum) <= bound
                                        and abs(rows[r][2 * j + 1] - ref_mass) <= bound)]
        if bad:
            off.update(bad)
            first = j if first is None else first
    return sorted(off), first


def _median_rank(masses: list[tuple[float, int]]) -> int | None:
    """The rank holding the lower median of the finite masses (with two ranks, the smaller):
    the reference every rank is compared with."""
    finite = sorted((m, r) for m, r in masses if math.isfinite(m))
    return finite[(len(finite) - 1) // 2][1] if finite else None
