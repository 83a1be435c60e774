"""Measurement probes that ride inside DDP as comm hooks: each records named rows per bucket
and hands DDP the correct fp32 average, so the run it observes trains as stock DDP would.

``ScaleMismatchProbe`` measures the seed's M4 (a rank-dependent fp16 pre-scale) on every bucket;
``mismatch_counts`` turns every rank's rows into the counts the record keeps.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch
import torch.distributed as dist


class BucketMismatch(NamedTuple):
    """One bucket's outcome under one workload, as one rank saw it."""

    overflowed: bool  # the rank-dependent fp16 sum holds a non-finite element
    off: bool  # this rank's average misses the fp32 average beyond fp16 rounding
    overflowed_uniform: bool  # the same with one uniform 2^12 on every rank
    off_uniform: bool
    nonfinite_elements: int  # non-finite elements of this rank's average
    replicas_differ: bool  # the ranks' averages differ (elementwise max vs min over ranks)
    overflowed_accumulator: bool  # the fp16 wires summed without ÷W overflowed
    overflowed_accumulator_uniform: bool


class _Wire(NamedTuple):
    overflowed: bool
    off: bool
    result: torch.Tensor


class ScaleMismatchProbe:
    """A DDP comm hook that measures the seed's M4 on every bucket and returns the correct
    fp32 average (the weights are held fixed anyway).

    Per bucket and workload: (1) the fp32 average (the truth) and Σ_r |g_r| (for the rounding
    bound); (2) PyTorch's ``fp16_compress_hook`` with a rank-dependent pre-scale: each rank
    casts g × 2^e_rank to fp16 and divides by W, the wires are summed in fp16, and each rank
    divides by its own 2^e (what a rank that believes everyone used its scale does); (3) the
    same with one uniform 2^12 (the control); (4) the seed's literal picture, the same fp16
    wires summed *without* the division by W ("the FP16 accumulator"), overflow only.

    An allreduce *overflowed* if its fp16 sum holds a non-finite element; a rank's result is
    *off* if a finite element misses the fp32 average by more than the rounding of 2W fp16
    operations (2^-11 relative each, plus the subnormal spacing), doubled — a bound the uniform
    control never exceeds; *replicas differ* if the ranks' results differ.

    Workloads (``spreads``, name → d), measured on the same buckets: each element × 10^U(-d, d)
    from a generator seeded by (seed, call, d) — identical on every rank, d = 0 for none.
    Three collectives per bucket carry every workload and variant at once."""

    UNIFORM_EXP = 12

    def __init__(self, rank: int, world_size: int, exponents: list[int], seed: int,
                 spreads: dict[str, float]) -> None:
        self.__name__ = self.__qualname__ = "ScaleMismatchProbe"  # DDP's logger names the hook
        self.rank, self.world_size, self.exponents = rank, world_size, exponents
        self.seed, self.spreads, self.calls = seed, spreads, 0
        self.rows: dict[str, list[BucketMismatch]] = {k: [] for k in spreads}

    def _factor(self, n: int, spread: float) -> torch.Tensor:
        if not spread:
            return torch.ones(n)
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + self.calls * 1009
                                          + int(spread * 100))
        return 10.0 ** ((torch.rand(n, generator=g) * 2 - 1) * spread)

    def _result(self, wire: torch.Tensor, absum: torch.Tensor, ref: torch.Tensor,
                exp: int) -> _Wire:
        """One summed, pre-divided fp16 wire, read back by a rank that scaled by 2^exp."""
        w = self.world_size
        overflowed = not bool(torch.isfinite(wire).all())
        res = wire.float() / 2.0 ** exp
        top = 2.0 ** max(self.exponents + [self.UNIFORM_EXP])
        tol = 2 * 2 * w * (2.0 ** -11 * absum * top / w + 2.0 ** -25) / 2.0 ** exp
        finite = torch.isfinite(res)
        off = bool(((res - ref).abs() > tol)[finite].any())
        return _Wire(overflowed, off, res)

    def __call__(self, state, bucket):  # no annotations: DDP rejects string ones
        buf = bucket.buffer()
        n, w = buf.numel(), self.world_size
        truth = torch.cat([buf, buf.abs()])  # fp32 sum and Σ|g| in one collective
        dist.all_reduce(truth)
        ref, absum = truth[:n] / w, truth[n:]
        exp = self.exponents[self.rank]
        factors = {k: self._factor(n, d).to(buf.device) for k, d in self.spreads.items()}
        casts = [(buf * f * 2.0 ** e).half() for f in factors.values()
                 for e in (exp, self.UNIFORM_EXP)]
        wires = torch.cat([c.div(w) for c in casts] + casts)  # ÷W (the stock hook), then not
        dist.all_reduce(wires)  # every workload's and variant's fp16 sum at once

        def part(i: int) -> torch.Tensor:
            return wires[i * n:(i + 1) * n]

        k2 = 2 * len(factors)  # where the accumulator (no ÷W) half starts, in parts
        mine, uniform = {}, {}
        for i, (k, f) in enumerate(factors.items()):
            mine[k] = self._result(part(2 * i), absum * f, ref * f, exp)
            uniform[k] = self._result(part(2 * i + 1), absum * f, ref * f, self.UNIFORM_EXP)
        differ = self._replicas_differ([mine[k].result for k in factors], n)
        for i, k in enumerate(factors):
            self.rows[k].append(BucketMismatch(
                overflowed=mine[k].overflowed, off=mine[k].off,
                overflowed_uniform=uniform[k].overflowed, off_uniform=uniform[k].off,
                nonfinite_elements=int((~torch.isfinite(mine[k].result)).sum()),
                replicas_differ=differ[i],
                overflowed_accumulator=not bool(torch.isfinite(part(k2 + 2 * i)).all()),
                overflowed_accumulator_uniform=not bool(
                    torch.isfinite(part(k2 + 2 * i + 1)).all())))
        self.calls += 1
        fut: torch.futures.Future = torch.futures.Future()
        fut.set_result(ref)
        return fut

    @staticmethod
    def _replicas_differ(results: list[torch.Tensor], n: int) -> list[bool]:
        """Per workload: do the ranks' results differ? (max and −min over ranks, one MAX.)"""
        clean = torch.cat([torch.nan_to_num(r, nan=0.0, posinf=3e38, neginf=-3e38)
                           for r in results])
        spread = torch.cat([clean, -clean])
        dist.all_reduce(spread, op=dist.ReduceOp.MAX)
        m = clean.numel()
        return [not torch.equal(spread[:m][i * n:(i + 1) * n], -spread[m:][i * n:(i + 1) * n])
                for i in range(len(results))]


def mismatch_counts(per_rank: Sequence[list[BucketMismatch]]) -> dict[str, int]:
    """The counts of one workload from every rank's rows (rank order): per-rank flags of the
    first rank, except *corrupted*, which counts allreduces where ANY rank's average is off."""
    n = min(len(rows) for rows in per_rank)
    first = per_rank[0][:n]
    on_any_rank = [[rows[i] for rows in per_rank] for i in range(n)]
    return {
        "allreduces": n,
        "overflowed": sum(r.overflowed for r in first),
        "corrupted": sum(any(r.off for r in ranks) for ranks in on_any_rank),
        "replicas_disagree": sum(r.replicas_differ for r in first),
        "overflowed_uniform": sum(r.overflowed_uniform for r in first),
        "corrupted_uniform": sum(any(r.off_uniform for r in ranks) for ranks in on_any_rank),
        "overflow_elements": sum(r.nonfinite_elements for r in first),
        "overflowed_accumulator": sum(r.overflowed_accumulator for r in first),
        "overflowed_accumulator_uniform": sum(r.overflowed_accumulator_uniform for r in first),
    }
