"""One run of the regression gate: BASE's and HEAD's ``harden()`` beside stock DDP in ``jobs``
fresh interleaved jobs (``job``), the excess and its verdict (``stat``), as one record.

A run costs about ``jobs × (3 arms × (steps + warmup) × a ~40 ms MLP step + ~10 s of start-up)``
on 2 cores (``GatePlan.estimate_s``); ``tox -e bench-gate -- BASE HEAD`` runs one.
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from openclaw_ref.bench.gate.job import STOCK, GateJobConfig, run_job
from openclaw_ref.bench.gate.stat import SEE, TOLERANCE, excess, old_rule, verdict
from openclaw_ref.bench.gate.trees import Side, Tree, extract
from openclaw_ref.sync.errors import BadInput

STEP_S_IDLE = 0.040  # one MLP step of one arm on 2 idle cores, for the estimate only
START_S = 10.0  # spawning two ranks and building the three arms


@dataclass(frozen=True)
class GatePlan:
    """How much a gate run measures: ``jobs`` fresh jobs of ``steps`` timed steps per arm."""

    jobs: int = 5
    steps: int = 800
    warmup: int = 10
    seed: int = 0

    def __post_init__(self) -> None:
        if self.jobs < 1:
            raise BadInput(f"a gate run needs at least 1 job; got {self.jobs}")
        if self.steps < 5 or self.warmup < 2:
            raise BadInput("a gate job needs at least 5 timed and 2 warm-up steps per arm")

    def estimate_s(self) -> float:
        """Seconds on 2 idle cores (an estimate from the step time, printed before the run)."""
        return self.jobs * (3 * (self.steps + self.warmup) * STEP_S_IDLE + START_S)


def job_record(raw: dict, seconds: float) -> dict:
    """What the record keeps of one job: every arm's ms per step to 10 µs (0.00025 of a 40 ms
    step, a hundredth of the tolerance; the figures are computed from these rounded times, so
    the record reproduces them), its events."""
    return {"step_ms": {arm: [round(ms, 2) for ms in times]
                        for arm, times in raw["step_ms"].items()},
            "events": raw["events"], "seconds": round(seconds, 1)}


def summarize(jobs: list[dict]) -> dict:
    """The figures and the verdict of a run's jobs (``stat``), and the stock step they are in."""
    steps = [j["step_ms"] for j in jobs]
    x = excess(steps)
    return {"excess": {"point": x.point, "low": x.low, "high": x.high, "steps": x.n},
            "verdict": verdict(x).value, "tolerance": TOLERANCE, "see": SEE,
            "stock_step_ms": statistics.median(statistics.median(s[STOCK]) for s in steps),
            "old_rule": old_rule(steps), "events": sum(j["events"] for j in jobs)}


def side_record(tree: Tree) -> dict:
    return {"rev": tree.rev, "sha": tree.sha}


def compare(repo: Path, base: str, head: str, plan: GatePlan,
            progress: Callable[[str], None] = lambda _: None) -> dict:
    """One gate run of ``head`` against ``base`` (any two commits of ``repo``): the record
    (both SHAs, the plan, every job's step times, the summary, wall seconds)."""
    t0 = time.monotonic()
    jobs: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="openclaw-gate-") as tmp:
        trees = [extract(repo, side, rev, Path(tmp))
                 for side, rev in ((Side.BASE, base), (Side.HEAD, head))]
        cfg = GateJobConfig(sides=tuple((t.side.value, t.root, t.module) for t in trees),
                            steps=plan.steps, warmup=plan.warmup, seed=plan.seed)
        for j in range(plan.jobs):
            t = time.monotonic()
            raw = run_job(dataclasses.replace(cfg, job=j))
            jobs.append(job_record(raw, time.monotonic() - t))
            x = summarize(jobs)["excess"]
            progress(f"  job {j + 1}/{plan.jobs}: {jobs[-1]['seconds']:.0f} s; HEAD's excess so "
                     f"far {x['point']:+.4f} [{x['low']:+.4f}, {x['high']:+.4f}] DDP steps")
    return {"base": side_record(trees[0]), "head": side_record(trees[1]),
            "plan": dataclasses.asdict(plan), "jobs": jobs, **summarize(jobs),
            "seconds": round(time.monotonic() - t0, 1), "load_after": os.getloadavg()}
