"""The gate's statistic, pure arithmetic on step times (unit-tested both ways).

The figure is HEAD's **excess**: in each round of a job, HEAD's hardened step minus BASE's (the
slowest rank's ms of each, milliseconds apart, so the host's drift cancels in the pair); a
job's figure is the median of those differences; the run's is the mean over its jobs, in ms,
with a Student-t interval over the jobs. Divided by the median stock DDP step of the run it
reads in stock DDP steps — a slowdown of 5 % of a DDP step reads 0.05 whatever ``harden()``
itself costs.

Why a median of differences in ms, not of ratios: the gate before took, per round,
``(head − base) ÷ stock`` and its median, then read that in µs as × the median stock step. A
median of ratios weights the rounds by how tightly they agree and divides each by its own
round's stock step, so a fixed added cost reads as ``d × (a weighted mean of 1/stock) × the
median stock`` — not ``d``: on recorded identical-code jobs with 500 µs added to HEAD's every
step on the computer, it read 435–553 µs, depending on the spread of the stock steps. The
median of ``head − base`` moves by exactly ``d`` for a cost ``d`` added to every step (the
differences of identical code are symmetric about 0: the arms are exchangeable), so the gate
prints the cost that was added.

Why jobs as the unit of the interval: a job that ran slow as a whole (its arms built in an
unlucky place, a neighbour's burst) shifts all its rounds alike, so its rounds are not
independent of each other; the job medians are. The Student-t interval over J job medians is
exact for normal job medians and needs no resampling; it widens by itself when jobs disagree.
"""

from __future__ import annotations

import enum
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

SEE = 0.05  # the slowdown the gate must see, in stock DDP steps
TOLERANCE = SEE / 2  # the excess it flags: half of SEE, so noise of either sign is as far
OLD_FACTOR = 1.05  # the gate before: asv --factor on hardened ÷ ddp (reported beside)
CONFIDENCE = 0.95


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


def t_two_sided(t: float, df: int) -> float:
    """P(|T| < t) for Student's t with ``df`` degrees of freedom (Abramowitz & Stegun 26.7.3–4,
    exact for integer ``df``: no scipy here)."""
    if df < 1:
        raise ValueError(f"need df >= 1; got {df}")
    theta = math.atan(abs(t) / math.sqrt(df))
    s, c = math.sin(theta), math.cos(theta)
    if df == 1:
        return 2 * theta / math.pi
    if df % 2:  # odd: (2/π)(θ + sin θ (cos θ + 2/3 cos³θ + … ))
        term = acc = c
        for k in range(1, (df - 1) // 2):
            term *= c * c * (2 * k) / (2 * k + 1)
            acc += term
        return (2 / math.pi) * (theta + s * acc)
    term = acc = 1.0  # even: sin θ (1 + 1/2 cos²θ + 1·3/(2·4) cos⁴θ + … )
    for k in range(1, df // 2):
        term *= c * c * (2 * k - 1) / (2 * k)
        acc += term
    return s * acc


def t_quantile(p: float, df: int) -> float:
    """The ``p`` quantile (p > 0.5) of Student's t with ``df`` degrees of freedom, by bisection
    on ``t_two_sided`` to 1e-10."""
    if not 0.5 < p < 1:
        raise ValueError(f"need 0.5 < p < 1; got {p}")
    want, lo, hi = 2 * p - 1, 0.0, 1.0
    while t_two_sided(hi, df) < want:
        hi *= 2
    while hi - lo > 1e-10:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if t_two_sided(mid, df) < want else (lo, mid)
    return (lo + hi) / 2


@dataclass(frozen=True)
class Excess:
    """HEAD's excess over BASE: the mean of the job medians of ``head − base`` (ms) with its
    two-sided interval at ``confidence``, and the median stock step it is read against."""

    ms: float
    low_ms: float
    high_ms: float
    stock_ms: float
    jobs: int
    rounds: int  # paired rounds behind it, all jobs together
    confidence: float

    @property
    def point(self) -> float:
        """In stock DDP steps."""
        return self.ms / self.stock_ms

    @property
    def low(self) -> float:
        return self.low_ms / self.stock_ms

    @property
    def high(self) -> float:
        return self.high_ms / self.stock_ms

    def to_json(self) -> dict:
        return {"point": self.point, "low": self.low, "high": self.high, "us": self.ms * 1e3,
                "low_us": self.low_ms * 1e3, "high_us": self.high_ms * 1e3,
                "stock_step_ms": self.stock_ms, "jobs": self.jobs, "rounds": self.rounds,
                "confidence": self.confidence}


def job_median_ms(head: Sequence[float], base: Sequence[float]) -> float:
    """One job's figure: the median over its rounds of HEAD's step minus BASE's (ms)."""
    h, b = np.asarray(head, dtype=np.float64), np.asarray(base, dtype=np.float64)
    if len(h) != len(b) or len(h) == 0:
        raise ValueError(f"need equal, non-empty step lists; got {len(h)} and {len(b)}")
    return float(np.median(h - b))


def t_interval(values: Sequence[float], confidence: float) -> tuple[float, float, float]:
    """(mean, low, high): the two-sided Student-t interval of the mean of ``values`` (at least
    2 of them)."""
    if len(values) < 2:
        raise ValueError("a t interval needs at least 2 values")
    mean = statistics.fmean(values)
    half = t_quantile(0.5 + confidence / 2, len(values) - 1) * statistics.stdev(values) \
        / math.sqrt(len(values))
    return mean, mean - half, mean + half


def excess(jobs: Sequence[Mapping[str, Sequence[float]]], confidence: float = CONFIDENCE, *,
           head: str = "head", base: str = "base", stock: str = "ddp") -> Excess:
    """HEAD's excess over ``jobs`` (each ``{arm: [ms per step]}``, HEAD and BASE paired by
    round, stock DDP's steps however many)."""
    medians = [job_median_ms(j[head], j[base]) for j in jobs]
    stock_ms = float(np.median(np.concatenate([np.asarray(j[stock], np.float64)
                                               for j in jobs])))
    if stock_ms <= 0:
        raise ValueError("stock step times must be positive")
    ms, low, high = t_interval(medians, confidence)
    return Excess(ms, low, high, stock_ms, len(jobs), sum(len(j[head]) for j in jobs),
                  confidence)


def verdict(x: Excess, tolerance: float = TOLERANCE, see: float = SEE) -> Verdict:
    """SLOWER when the excess is at least ``tolerance`` and its whole interval lies above 0;
    else NOISY when the interval still reaches ``see`` (the slowdown the gate promises to see
    could hide in it); else WITHIN."""
    if x.point >= tolerance and x.low > 0:
        return Verdict.SLOWER
    return Verdict.NOISY if x.high >= see else Verdict.WITHIN


def median_ratio(num: Sequence[float], den: Sequence[float]) -> float:
    """The median of ``num`` over the median of ``den`` (one job's arm ÷ stock DDP)."""
    return statistics.median(num) / statistics.median(den)


def old_rule(jobs: Sequence[Mapping[str, Sequence[float]]], *, head: str = "head",
             base: str = "base", stock: str = "ddp") -> dict:
    """The gate before, applied to these same jobs for comparison: each side's ``÷ ddp`` as
    the median over jobs of the job's median step ÷ its median stock step, flagged when HEAD's
    exceeds BASE's by ``OLD_FACTOR`` (asv ``--no-stats --factor 1.05``). Measured in one job
    here, which is kinder to it than asv's two sessions."""
    b = statistics.median(median_ratio(j[base], j[stock]) for j in jobs)
    h = statistics.median(median_ratio(j[head], j[stock]) for j in jobs)
    return {"base_over_ddp": b, "head_over_ddp": h, "flagged": h > b * OLD_FACTOR}
