"""When a gate run stops: after a few jobs when HEAD's excess is clearly inside or clearly beyond
the tolerance, else at the last job with ``stat.verdict``'s rule — and the error that costs.

The rule (``StoppingRule``): the gate looks at its jobs after each count in ``looks``. At an
early look it computes the excess's interval at ``early_confidence`` (two-sided; each tail
``early_error / early looks``) and stops

* **slower** when that whole interval lies above ``TOLERANCE`` (clearly beyond);
* **within** when it lies wholly below ``TOLERANCE`` (clearly inside);

and otherwise runs the next jobs. At the last look it decides as a fixed-length run does
(``stat.verdict`` on the 95 % interval).

**Its error.** If the job medians are normal and independent (the model of ``stat``'s t
interval), an early look's interval misses the true excess on a given side with probability
at most its tail; so, by Bonferroni over the early looks, the chance that ANY early stop lands
on the wrong side of the tolerance is at most ``early_error`` in each direction: identical
code (true excess 0, below it) is stopped *slower* early in at most 1 % of runs, a slowdown of
``SEE`` (above it) stopped *within* early in at most 1 %. The last look's own errors are the
fixed rule's, at fewer jobs when the run goes that far; the early stops add at most
``early_error`` to each. ``operating`` measures the rule by simulation (unit-tested with
Hypothesis against that bound), and the calibration's table reports it at the job-to-job
spread it measured.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from openclaw_ref.bench.gate.stat import (
    CONFIDENCE,
    SEE,
    TOLERANCE,
    Excess,
    Verdict,
    excess,
    t_quantile,
    verdict,
)
from openclaw_ref.sync.errors import BadInput

MAX_JOBS = 14  # a run's most jobs: ~3.3 min on 2 idle cores at 200 rounds (run.GatePlan)
FIRST_LOOK = 4  # the fewest jobs an early look trusts (a t interval on 3 degrees of freedom)
EARLY_ERROR = 0.01


class Stop(enum.Enum):
    """Why a run stopped where it did; the value is what the record says."""

    BEYOND = "early: clearly beyond the tolerance"
    INSIDE = "early: clearly inside the tolerance"
    LAST = "at the last look"


@dataclass(frozen=True)
class StoppingRule:
    """After how many jobs the gate looks, and the error its early stops may spend."""

    looks: tuple[int, ...] = tuple(range(FIRST_LOOK, MAX_JOBS + 1, 2))
    early_error: float = EARLY_ERROR  # per direction, over all early looks (Bonferroni)
    confidence: float = CONFIDENCE  # the last look's interval, as a fixed-length run's

    def __post_init__(self) -> None:
        if not self.looks or self.looks[0] < 2 or list(self.looks) != sorted(set(self.looks)):
            raise BadInput(f"looks must increase from at least 2 jobs; got {self.looks}")
        if not 0 < self.early_error < 0.5 or not 0.5 < self.confidence < 1:
            raise BadInput("early_error must lie in (0, 0.5) and confidence in (0.5, 1)")

    @classmethod
    def up_to(cls, jobs: int, early: bool = True) -> StoppingRule:
        """The rule of a run of at most ``jobs`` jobs: looks after 4, 6, … and ``jobs`` itself
        (only ``jobs`` when not ``early``: the fixed-length rule)."""
        if jobs < 2:
            raise BadInput(f"a gate run needs at least 2 jobs (an interval needs two); got "
                           f"{jobs}")
        early_looks = tuple(range(FIRST_LOOK, jobs, 2)) if early else ()
        return cls(looks=(*early_looks, jobs))

    @property
    def max_jobs(self) -> int:
        return self.looks[-1]

    @property
    def early_confidence(self) -> float:
        """The two-sided level of an early look's interval (each tail early_error / looks)."""
        early = max(1, len(self.looks) - 1)
        return 1 - 2 * self.early_error / early

    def decide(self, jobs: Sequence[Mapping[str, Sequence[float]]]
               ) -> tuple[Verdict, Stop, Excess] | None:
        """The verdict if the run stops after these ``jobs`` (None: run the next ones)."""
        n = len(jobs)
        if n not in self.looks:
            return None
        if n == self.max_jobs:
            x = excess(jobs, self.confidence)
            return verdict(x), Stop.LAST, x
        x = excess(jobs, self.early_confidence)
        if x.low > TOLERANCE:
            return Verdict.SLOWER, Stop.BEYOND, x
        if x.high < TOLERANCE:
            return Verdict.WITHIN, Stop.INSIDE, x
        return None


def operating(rule: StoppingRule, excess_steps: float, sigma_steps: float,
              runs: int = 20_000, seed: int = 0) -> dict[str, float]:
    """The rule on simulated runs whose job medians are normal with mean ``excess_steps`` and
    spread ``sigma_steps`` (stock DDP steps): the share flagged *slower*, found *noisy*,
    stopped early on the wrong side of the tolerance, and the mean jobs run. Vectorized: every
    run draws all its jobs; each look's decision is applied to the runs still going."""
    rng = np.random.default_rng(seed)
    medians = excess_steps + sigma_steps * rng.standard_normal((runs, rule.max_jobs))
    going = np.ones(runs, dtype=bool)
    slower, noisy, wrong = (np.zeros(runs, dtype=bool) for _ in range(3))
    jobs = np.full(runs, rule.max_jobs)
    for n in rule.looks:
        m = medians[:, :n]
        mean, sd = m.mean(axis=1), m.std(axis=1, ddof=1)
        last = n == rule.max_jobs
        level = rule.confidence if last else rule.early_confidence
        half = t_quantile(0.5 + level / 2, n - 1) * sd / np.sqrt(n)
        low, high = mean - half, mean + half
        if last:
            flag = going & (mean >= TOLERANCE) & (low > 0)
            slower |= flag
            noisy |= going & ~flag & (high >= SEE)
            break
        beyond, inside = going & (low > TOLERANCE), going & (high < TOLERANCE)
        slower |= beyond
        wrong |= (beyond & (excess_steps < TOLERANCE)) | (inside & (excess_steps > TOLERANCE))
        jobs[beyond | inside] = n
        going &= ~(beyond | inside)
    return {"flagged": float(slower.mean()), "noisy": float(noisy.mean()),
            "wrong_early": float(wrong.mean()), "mean_jobs": float(jobs.mean())}
