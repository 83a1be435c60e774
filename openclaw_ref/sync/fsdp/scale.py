"""The FSDP2 guard's scale check: every rank must change its reduced gradient shards by the same
uniform factor between the reduction and the optimizer step (``clip_grad_norm_`` on the DTensor
gradients: the global norm's factor; a ``GradScaler``'s unscale; nothing: 1). Clipping each
rank's shards by their own local norm gives each rank another factor — silently, in stock FSDP2.

How. When FSDP2 reduces a sharded parameter's gradient (its post-accumulate-grad hook, after the
reduce-scatter and HSDP's all-reduce; overwritten at each accumulation) the rank keeps a copy of
its local shard of that gradient (sampled parameters only, see Cost); at the optimizer step's
pre-hook it takes the L1 and L2 norms of those copies and of the same shards now. A uniform
scaling by c gives an L1 ratio of c and an L2 ratio of c; a change that is not a uniform
scaling (``clip_grad_value_``, legal: the same element-wise function on every shard) gives two
different ratios, and that rank is not judged. The factor
rides the step's int64 exchange as the bits of a float64 (each rank writes only its own row, the
others are zero, so the sum carries it exactly); NaN: not judged.

Tolerances. Scaling a gradient element rounds it by at most u (the unit roundoff of the
gradient's dtype: 2^-24 for fp32) relative, so each norm ratio is within u of the true factor
(the norms are accumulated in float64): the two ratios of a uniform scaling agree within 2u
(``UNIFORM`` = 4u), and ranks scaled by one factor agree within 2u. Ranks are compared at
``FACTOR`` = max(1e-3, 4u): a fault that changes the step by less than 0.1% is not named.

Cost. The factor is measured on a sample, not the whole model: the smallest parameters (by
global size, then registration order: the same on every rank) while they fit in ``SAMPLE``
elements (or the smallest one alone where it is larger), copied as reduced and normed at the
optimizer step. A rank's clipping, unscaling or local-norm clipping scales every gradient by
one factor, so any nonzero part shows it; measuring all of them cost about four passes over the
local gradients per step (8.5 + 5.1 ms per million elements here under load). What the sample
gives up: a rank that rescales only parameters outside it.

Invariant: ``judge_scales`` reads only the exchanged rows, so every rank names the same ranks.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence

import torch

FACTOR = 1e-3  # the relative difference between two ranks' factors that is named
SAMPLE = 1 << 16  # at most this many global elements measured, unless the smallest is larger
NOT_JUDGED = float("nan")


def to_bits(x: float) -> int:
    """A float64 as the int64 with the same bits (the exchange block is int64)."""
    return struct.unpack("<q", struct.pack("<d", x))[0]


def from_bits(i: int) -> float:
    return struct.unpack("<d", struct.pack("<q", i))[0]


def unit_roundoff(dtypes: Sequence[torch.dtype]) -> float:
    """The largest unit roundoff of the gradients' dtypes (FSDP2 gives each sharded parameter
    a gradient of its own dtype; the start-up check proves them equal on every rank)."""
    return max((torch.finfo(d).eps / 2 for d in dtypes if d.is_floating_point), default=0.0)


def sampled(sizes: Sequence[int], budget: int = SAMPLE) -> frozenset[int]:
    """Indices of the parameters the factor is measured on: smallest global size first (ties:
    registration order) while they fit in ``budget`` elements, at least one — the same set on
    every rank, which the start-up check proves hold the same parameters."""
    order = sorted(range(len(sizes)), key=lambda i: (sizes[i], i))
    picked, total = [], 0
    for i in order:
        if total + sizes[i] > budget:
            break
        picked.append(i)
        total += sizes[i]
    return frozenset(picked or order[:1])


class ScaleRecord:
    """One rank's norms of its reduced gradient shards since the last optimizer step, on the
    sampled parameters (``sampled``; module docstring, Cost)."""

    def __init__(self, sizes: Sequence[int], u: float) -> None:
        # a copy of each sampled shard as reduced (at most ``SAMPLE`` elements in all): the norms
        # are taken at the optimizer step, with the shards now, in four batched kernels
        self.at_reduce: list[torch.Tensor | None] = [None] * len(sizes)
        self.watched = sampled(sizes)
        self.u = u

    def reduced(self, i: int, grad: torch.Tensor | None) -> None:
        """Parameter ``i``'s gradient was just reduced (``grad``: this rank's local shard)."""
        if grad is None or i not in self.watched:
            return
        self.at_reduce[i] = grad.detach().clone()

    def factor(self, local_grads: Sequence[torch.Tensor | None]) -> float:
        """The uniform factor this rank applied to its reduced shards since they were reduced,
        or NaN when it applied none that is uniform, or nothing was reduced (not judged).
        ``local_grads``: the parameters' local gradient shards now (by the same index; only
        the sampled ones are read)."""
        picked = [i for i, rec in enumerate(self.at_reduce) if rec is not None]
        if not picked:
            return NOT_JUDGED
        l1_red, l2_red = _norms([self.at_reduce[i] for i in picked])
        l1_now, l2_now = _norms([local_grads[i] for i in picked if local_grads[i] is not None])
        return uniform_factor(l1_red, l2_red, l1_now, l2_now, self.u)

    def clear(self) -> None:
        self.at_reduce[:] = [None] * len(self.at_reduce)


def _norms(tensors: list[torch.Tensor]) -> tuple[float, float]:
    """(L1, L2) of ``tensors`` taken together, accumulated in float64."""
    if not tensors:
        return 0.0, 0.0
    l1 = torch.stack(torch._foreach_norm(tensors, 1, dtype=torch.float64)).sum()
    l2 = torch.stack(torch._foreach_norm(tensors, 2, dtype=torch.float64)).square().sum().sqrt()
    return float(l1), float(l2)


def uniform_factor(l1_red: float, l2_red: float, l1_now: float, l2_now: float,
                   u: float) -> float:
    """c when (L1, L2) now are c × (L1, L2) at the reduction within rounding; otherwise NaN."""
    if not all(math.isfinite(v) for v in (l1_red, l2_red, l1_now, l2_now)) or l1_red <= 0 \
            or l2_red <= 0:
        return NOT_JUDGED
    c1, c2 = l1_now / l1_red, l2_now / l2_red
    if abs(c1 - c2) > 4 * u * max(c1, c2):
        return NOT_JUDGED  # not a uniform scaling (clip_grad_value_, a mask, …)
    return c2


def judge_scales(factors: Sequence[float], tol: float = FACTOR) -> list[int]:
    """The ranks (indices into ``factors``) whose factor differs: ranks with a NaN factor are
    not judged; the judged ones are grouped by factor (relative tolerance ``tol``); when one
    group is larger than every other and holds two ranks or more, the ranks outside it are
    named, otherwise every judged rank (no two agree, or a tie: each applied its own factor)."""
    judged = sorted((f, r) for r, f in enumerate(factors) if not math.isnan(f))
    groups: list[list[int]] = []
    first = 0.0
    for f, r in judged:
        if groups and abs(f - first) <= tol * max(abs(f), abs(first)):
            groups[-1].append(r)
        else:
            groups.append([r])
            first = f
    if len(groups) <= 1:
        return []
    sizes = sorted((len(g) for g in groups), reverse=True)
    if sizes[0] >= 2 and sizes[0] > sizes[1]:
        biggest = max(groups, key=len)
        return sorted(r for _, r in judged if r not in biggest)
    return sorted(r for _, r in judged)


def factor_text(factors: Sequence[float], global_ranks: Sequence[int]) -> str:
    return ", ".join(f"rank {global_ranks[r]}: " + ("not a uniform scaling" if math.isnan(f)
                                                     else f"×{f:.6g}")
                     for r, f in enumerate(factors))


def tolerance(u: float) -> float:
    """The relative difference between ranks' factors that is named (module docstring)."""
    return max(FACTOR, 4 * u)
