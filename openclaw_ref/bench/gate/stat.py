"""The gate's statistic and its decision, pure arithmetic on step times (unit-tested both ways).

The figure is HEAD's **excess**: per step, (HEAD's hardened step − BASE's hardened step) ÷ the
stock DDP step of the same round, its median over every timed step of every job, in stock DDP
steps — a slowdown of 5 % of a DDP step reads 0.05 whatever ``harden()`` itself costs. The
three arms ran milliseconds apart in one job, so the host's drift cancels in each step's
difference. Its interval is a two-stage bootstrap: resample the jobs, then the steps inside
each, so a job that ran slow as a whole widens the interval instead of hiding in thousands
of steps.

Why not the ratio to stock DDP at ``--factor 1.05`` (the gate before): a slowdown of 5 % of a
DDP step moves ``hardened ÷ ddp`` by 5 % of the ratio's denominator, i.e. from 1.10 to 1.15,
a factor 1.045 — under the factor even without noise; and BASE and HEAD were measured in two
sessions minutes apart, where this host moves by ±12 %.

The decision (``Verdict``): SLOWER when HEAD's excess is at least ``TOLERANCE`` and its whole
interval lies above zero; else NOISY when the interval still reaches ``SEE`` (the slowdown
the gate promises to see could hide in it: the host was too busy to tell); else WITHIN.
"""

from __future__ import annotations

import enum
import statistics
from collections.abc import Mapping, Sequence

import numpy as np

from openclaw_ref.core.metrics import RatioInterval

SEE = 0.05  # the slowdown the gate must see, in stock DDP steps
TOLERANCE = SEE / 2  # the excess it flags: half of SEE, so noise of either sign is as far
OLD_FACTOR = 1.05  # the gate before: asv --factor on hardened ÷ ddp (reported beside)
CONFIDENCE = 0.95
RESAMPLES = 2000


class Verdict(enum.Enum):
    """The gate's answer; the value is what it prints."""

    SLOWER = "slower"  # flagged: HEAD adds at least TOLERANCE of a DDP step, surely above 0
    WITHIN = "within"  # not flagged, and the interval rules out a slowdown of SEE
    NOISY = "noisy"  # not flagged, but a slowdown of SEE fits the interval: rerun when idle

    @property
    def exit_code(self) -> int:
        """0 within; 1 slower (a regression, as asv continuous exits); 5 noisy (the project's
        environment error: the host, not the code)."""
        return {Verdict.WITHIN: 0, Verdict.SLOWER: 1, Verdict.NOISY: 5}[self]


def excess_per_step(head: Sequence[float], base: Sequence[float],
                    stock: Sequence[float]) -> np.ndarray:
    """(head − base) ÷ stock, step by step (three arms' ms of the same rounds)."""
    h, b, s = (np.asarray(x, dtype=np.float64) for x in (head, base, stock))
    if not (len(h) == len(b) == len(s)) or len(h) == 0:
        raise ValueError(f"need equal, non-empty step lists; got {len(h)}, {len(b)}, {len(s)}")
    if s.min() <= 0:
        raise ValueError("stock step times must be positive")
    return (h - b) / s


def two_stage_interval(jobs: Sequence[np.ndarray], *, resamples: int = RESAMPLES,
                       confidence: float = CONFIDENCE, seed: int = 0) -> RatioInterval:
    """The median of every job's values pooled, with a seeded two-stage bootstrap interval
    (jobs drawn with replacement, then each drawn job's values). Jobs must be equally long;
    one job is the plain bootstrap. Same inputs, same interval."""
    if not jobs or len({len(j) for j in jobs}) != 1 or len(jobs[0]) == 0:
        raise ValueError("need one or more equally long, non-empty jobs")
    data = np.stack([np.asarray(j, dtype=np.float64) for j in jobs])  # (jobs, steps)
    n_jobs, n_steps = data.shape
    rng = np.random.default_rng(seed)
    which = rng.integers(0, n_jobs, size=(resamples, n_jobs))
    steps = rng.integers(0, n_steps, size=(resamples, n_jobs, n_steps))
    drawn = data[which[:, :, None], steps].reshape(resamples, -1)
    tail = 100 * (1 - confidence) / 2
    low, high = np.percentile(np.median(drawn, axis=1), [tail, 100 - tail])
    return RatioInterval(float(np.median(data)), float(low), float(high), data.size)


def excess(jobs: Sequence[Mapping[str, Sequence[float]]], *, head: str = "head",
           base: str = "base", stock: str = "ddp") -> RatioInterval:
    """HEAD's excess over BASE in stock steps, over ``jobs`` (each ``{arm: [ms per step]}``)."""
    return two_stage_interval([excess_per_step(j[head], j[base], j[stock]) for j in jobs])


def verdict(x: RatioInterval, tolerance: float = TOLERANCE, see: float = SEE) -> Verdict:
    """SLOWER, WITHIN or NOISY for an excess ``x`` (module docstring)."""
    if x.point >= tolerance and x.low > 0:
        return Verdict.SLOWER
    return Verdict.NOISY if x.high >= see else Verdict.WITHIN


def median_ratio(num: Sequence[float], den: Sequence[float]) -> float:
    """The median of per-step ratios, as the hook-cost job reports each arm ÷ ddp."""
    return float(np.median(np.asarray(num, dtype=np.float64) / np.asarray(den, np.float64)))


def old_rule(jobs: Sequence[Mapping[str, Sequence[float]]], *, head: str = "head",
             base: str = "base", stock: str = "ddp") -> dict:
    """The gate before, applied to these same jobs for comparison: each side's ``÷ ddp`` as
    the median over jobs of the median per-step ratio, flagged when HEAD's exceeds BASE's by
    ``OLD_FACTOR`` (asv ``--no-stats --factor 1.05``). Measured in one job here, which is kinder
    to it than asv's two sessions."""
    b = statistics.median(median_ratio(j[base], j[stock]) for j in jobs)
    h = statistics.median(median_ratio(j[head], j[stock]) for j in jobs)
    return {"base_over_ddp": b, "head_over_ddp": h, "flagged": h > b * OLD_FACTOR}
