"""One run of the regression gate: BASE's and HEAD's ``harden()`` beside stock DDP, job after job
on the same two ranks (``job``), until the stopping rule decides (``stopping``), as one record.

Where a run's time goes (2 gloo ranks, 2 cores): extracting both libraries from git, ~0.1 s;
spawning the ranks and importing torch and both libraries, ~3 s idle (5–10 s at load 8), once
per run — the jobs share the ranks; then per job ~0.5 s building and closing the arms, 5
warm-up rounds, and ``rounds`` timed rounds of ~2.25 steps (``GatePlan.estimate_s``).
``tox -e bench-gate -- BASE HEAD`` runs one.
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from openclaw_ref.bench.gate.job import WORLD_SIZE, GateJobConfig, run_job
from openclaw_ref.bench.gate.stat import SEE, TOLERANCE, Excess, Verdict, excess, old_rule
from openclaw_ref.bench.gate.stopping import Stop, StoppingRule
from openclaw_ref.bench.gate.trees import Side, Tree, extract
from openclaw_ref.core.launch import LaunchConfig, RankPool
from openclaw_ref.sync.errors import BadInput

STEP_S_IDLE = 0.027  # one hardened MLP step on 2 idle cores (stock: ~0.024), for estimates
BARRIER_S = 0.0003  # the barrier before each timed step
JOB_S = 0.5  # building, warming and closing one job's arms beyond its steps
START_S = 5.0  # spawning two ranks, importing torch and both libraries


@dataclass(frozen=True)
class GatePlan:
    """How much a gate run measures: up to ``rule.max_jobs`` jobs of ``rounds`` timed rounds,
    stopping at the first of ``rule.looks`` where the rule decides."""

    rounds: int = 200
    warmup: int = 5
    stock_every: int = 4
    rule: StoppingRule = field(default_factory=StoppingRule)
    seed: int = 0

    def __post_init__(self) -> None:
        if self.rounds < 5 or self.warmup < 2 or self.stock_every < 1:
            raise BadInput("a gate job needs at least 5 timed rounds, 2 warm-up rounds, and "
                           "stock DDP every >= 1 rounds")

    @property
    def max_jobs(self) -> int:
        return self.rule.max_jobs

    def job_s(self) -> float:
        """Seconds of one job on 2 idle cores (estimated from the step time)."""
        steps = self.rounds * (2 + 1 / self.stock_every) + 3 * self.warmup
        return steps * (STEP_S_IDLE + BARRIER_S) + JOB_S

    def estimate_s(self, jobs: float | None = None) -> float:
        """Seconds of a run of ``jobs`` jobs (default: all of them; a mean may be fractional)
        on 2 idle cores."""
        return START_S + (self.max_jobs if jobs is None else jobs) * self.job_s()

    def job_config(self, trees: list[Tree]) -> GateJobConfig:
        return GateJobConfig(sides=tuple((t.side.value, t.root, t.module) for t in trees),
                             rounds=self.rounds, warmup=self.warmup,
                             stock_every=self.stock_every, seed=self.seed)

    def to_json(self) -> dict:
        return {"rounds": self.rounds, "warmup": self.warmup, "stock_every": self.stock_every,
                "looks": list(self.rule.looks), "early_error": self.rule.early_error,
                "confidence": self.rule.confidence, "seed": self.seed}


def job_record(raw: dict, seconds: float) -> dict:
    """What the record keeps of one job: every arm's ms per step to 10 µs (a fiftieth of the
    smallest plant the calibration makes; the figures are computed from these rounded times,
    so the record reproduces them), its events, its seconds and where they went (rank 0's)."""
    return {"step_ms": {arm: [round(ms, 2) for ms in times]
                        for arm, times in raw["step_ms"].items()},
            "events": raw["events"], "seconds": round(seconds, 1),
            "phases": {k: round(v, 2) for k, v in raw["phases"].items()}}


def summarize(jobs: list[dict], decision: tuple[Verdict, Stop, Excess]) -> dict:
    """The figures of a run's jobs: the excess with its 95 % interval (what it prints), the
    verdict and why it stopped (``decision``: the stopping rule's, with the interval it was
    decided on), the stock step, the old rule beside."""
    steps = [j["step_ms"] for j in jobs]
    verdict_, stop, decided = decision
    shown = excess(steps)
    return {"excess": shown.to_json(), "decided_by": decided.to_json(), "verdict": verdict_.value,
            "stop": stop.value, "tolerance": TOLERANCE, "see": SEE,
            "stock_step_ms": shown.stock_ms,
            "base_step_ms": statistics.median(ms for s in steps for ms in s["base"]),
            "old_rule": old_rule(steps), "events": sum(j["events"] for j in jobs)}


def side_record(tree: Tree) -> dict:
    return {"rev": tree.rev, "sha": tree.sha}


def compare(repo: Path, base: str, head: str, plan: GatePlan,
            progress: Callable[[str], None] = lambda _: None) -> dict:
    """One gate run of ``head`` against ``base`` (any two commits of ``repo``): the record
    (both SHAs, the plan, every job's step times, the summary, where the time went)."""
    t0 = time.monotonic()
    jobs: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="openclaw-gate-") as tmp:
        trees = [extract(repo, side, rev, Path(tmp))
                 for side, rev in ((Side.BASE, base), (Side.HEAD, head))]
        cfg = plan.job_config(trees)
        started = time.monotonic()
        with RankPool(LaunchConfig(world_size=WORLD_SIZE, backend="gloo",
                                   threads_per_rank=1)) as pool:
            start_s = time.monotonic() - started
            decision: tuple[Verdict, Stop, Excess] | None = None
            while decision is None:
                t = time.monotonic()
                raw = run_job(pool, dataclasses.replace(cfg, job=len(jobs)))
                jobs.append(job_record(raw, time.monotonic() - t))
                decision = plan.rule.decide([j["step_ms"] for j in jobs])
                progress(job_line(jobs, plan))
    return {"base": side_record(trees[0]), "head": side_record(trees[1]),
            "plan": plan.to_json(), "jobs": jobs, **summarize(jobs, decision),
            "start_s": round(start_s, 1), "seconds": round(time.monotonic() - t0, 1),
            "load_after": os.getloadavg()}


def job_line(jobs: list[dict], plan: GatePlan) -> str:
    """The progress line after a job: its seconds, and the excess so far in µs."""
    line = f"  job {len(jobs)}/{plan.max_jobs}: {jobs[-1]['seconds']:.0f} s"
    if len(jobs) < 2:
        return line
    x = excess([j["step_ms"] for j in jobs])
    return (f"{line}; HEAD's excess so far {x.ms * 1e3:+.0f} µs [{x.low_ms * 1e3:+.0f}, "
            f"{x.high_ms * 1e3:+.0f}] ({x.point:+.4f} of a {x.stock_ms:.1f} ms DDP step)")
