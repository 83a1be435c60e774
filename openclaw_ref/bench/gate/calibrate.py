"""The gate's own error rates, measured as users run it: ``tox -e gate-calibrate``.

* **Quiet**: the gate, run after run, on the calibrated commit against a scratch commit that
  only adds a comment (``plant.Change.COMMENT``): the flags counted are false alarms.
* **Sensitive**: against scratch commits that spin a fixed number of µs per step in the step
  guard (``plant.Change.BUSY_WAIT``), sized to ``sizes`` of the MLP's stock DDP step as the
  first quiet run measured it: the flags counted are detections.
* **Cost**: every run's wall seconds and the host's load average before it.
* **Measure what was planted**: every run's excess in µs beside the µs planted.

The runs go round the conditions (quiet, +3 %, +5 %, +10 %, quiet, …) so that the host's
drift over hours falls on every condition alike. After every finished run the record is
rewritten atomically under ``<out>/.partial/``; a rerun of the same command resumes there
(same commit and plan, else it refuses). The scratch commits' refs are deleted when the
command ends, however it ends; the table is rendered from the finished record (``table``).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from openclaw_ref.bench.gate.plant import Change, remove_refs, scratch_commit
from openclaw_ref.bench.gate.run import GatePlan, compare
from openclaw_ref.bench.gate.stopping import StoppingRule
from openclaw_ref.bench.gate.table import publish, read_calibration, render, render_blocks
from openclaw_ref.bench.gate.trees import resolve
from openclaw_ref.core.environment import cpu_model, git_sha
from openclaw_ref.core.jsonio import read_json, write_json_atomic, write_text_atomic
from openclaw_ref.sync.errors import BadInput

SIZES = (0.03, 0.05, 0.10)  # planted slowdowns, in stock DDP steps
RUNS = 5  # gate runs per condition
RECORD = "calibration.json"
PARTIAL = ".partial"
SCHEMA = 2  # 2: runs stop by the sequential rule; excess in µs (a mean of job medians)


@dataclass(frozen=True)
class Condition:
    """One column of the experiment: what the scratch commit changes, and by how much."""

    change: Change
    fraction: float = 0.0  # of the stock DDP step; 0 for the comment

    @property
    def name(self) -> str:
        return "identical" if self.change is Change.COMMENT else f"+{self.fraction:.0%}"


@dataclass(frozen=True)
class CalibrationPlan:
    runs: int = RUNS
    sizes: tuple[float, ...] = SIZES
    gate: GatePlan = dataclasses.field(default_factory=GatePlan)

    def __post_init__(self) -> None:
        if self.runs < 1 or not self.sizes or any(not 0 < f < 1 for f in self.sizes):
            raise BadInput(f"need >= 1 run and sizes in (0, 1); got {self.runs}, {self.sizes}")

    @property
    def conditions(self) -> tuple[Condition, ...]:
        return (Condition(Change.COMMENT),
                *(Condition(Change.BUSY_WAIT, f) for f in self.sizes))

    def schedule(self) -> Iterator[tuple[int, Condition]]:
        """(run index, condition), round by round; the first is quiet (it sizes the plants)."""
        for i in range(self.runs):
            for condition in self.conditions:
                yield i, condition

    def estimate_s(self) -> float:
        return self.runs * len(self.conditions) * self.gate.estimate_s()

    def to_json(self) -> dict:
        """As the record holds it (lists, not tuples: what a resumed record is compared to)."""
        return json.loads(json.dumps({"runs": self.runs, "sizes": self.sizes,
                                      "gate": self.gate.to_json()}))


def host() -> dict:
    """What the figures were measured on (beside them in the record and the table)."""
    import torch

    return {"cpu_model": cpu_model(), "cpu_count": os.cpu_count(), "torch": torch.__version__,
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}


def new_record(plan: CalibrationPlan, head: str, checkout: str) -> dict:
    return {"schema": SCHEMA, "plan": plan.to_json(), "head": head, "checkout": checkout,
            "host": host(), "stock_step_ms": None, "busy_wait_us": {}, "runs": [],
            "wall_s": 0.0, "complete": False}


def resumable(path: Path, plan: CalibrationPlan, head: str) -> dict | None:
    """The partial record at ``path`` if it is this commit's and this plan's; ``BadInput`` if it
    is another's (delete it, or finish that one); None if there is none."""
    if not path.exists():
        return None
    record = read_json(path)
    if record.get("head") != head or record.get("plan") != plan.to_json():
        raise BadInput(f"{path} holds a calibration of {str(record.get('head'))[:12]} with "
                       f"another plan; finish it with that commit and plan, or delete it")
    return record


def done(record: dict, index: int, condition: Condition) -> bool:
    return any(r["condition"] == condition.name and r["index"] == index for r in record["runs"])


def busy_wait_us(stock_step_ms: float, fraction: float) -> int:
    """The spin that costs ``fraction`` of a stock step of ``stock_step_ms``."""
    return max(1, round(fraction * stock_step_ms * 1e3))


def ref_name(us: int) -> str:
    """The scratch ref's name of a plant of ``us`` µs (0: the comment)."""
    return f"busy-wait-{us}us" if us else "identical"


def scratch_for(repo: Path, record: dict, condition: Condition) -> tuple[str, int]:
    """(the scratch commit of ``condition``, its spin in µs)."""
    us = record["busy_wait_us"][condition.name] if condition.change is Change.BUSY_WAIT else 0
    return scratch_commit(repo, record["head"], condition.change, ref_name(us), us), us


def size_plants(record: dict, plan: CalibrationPlan, first_run: dict) -> None:
    record["stock_step_ms"] = first_run["stock_step_ms"]
    record["busy_wait_us"] = {c.name: busy_wait_us(first_run["stock_step_ms"], c.fraction)
                              for c in plan.conditions if c.change is Change.BUSY_WAIT}


def calibrate(repo: Path, out: Path, plan: CalibrationPlan,
              progress: Callable[[str], None] = print) -> dict:
    """Every scheduled gate run not yet in the partial record, each saved as it finishes; the
    finished record (also written to ``out/RECORD``). Scratch refs are removed on the way out."""
    head = resolve(repo, "HEAD")
    partial = out / PARTIAL / RECORD
    record = resumable(partial, plan, head) or new_record(plan, head, git_sha(repo))
    total = plan.runs * len(plan.conditions)
    t0, ran = time.monotonic(), 0
    try:
        for index, condition in plan.schedule():
            if done(record, index, condition):
                continue
            started = time.monotonic()
            commit, us = scratch_for(repo, record, condition)
            left = total - len(record["runs"])
            eta = (time.monotonic() - t0) / ran * left if ran else plan.gate.estimate_s() * left
            progress(f"[{len(record['runs']) + 1}/{total}] {condition.name} #{index + 1}"
                     f"{f' (busy-wait {us} µs)' if us else ''}; ~{eta / 60:.0f} min left")
            load = os.getloadavg()
            run = compare(repo, head, commit, plan.gate, progress)
            record["runs"].append({"condition": condition.name, "index": index,
                                   "fraction": condition.fraction, "busy_wait_us": us,
                                   "load_before": load, **run})
            if record["stock_step_ms"] is None:
                size_plants(record, plan, run)
            ran += 1
            record["wall_s"] += time.monotonic() - started
            write_json_atomic(partial, record, compact=True)
            x = run["excess"]
            progress(f"  → {run['verdict']} after {x['jobs']} jobs ({run['stop']}): planted "
                     f"{us} µs, measured {x['us']:+.0f} µs [{x['low_us']:+.0f}, "
                     f"{x['high_us']:+.0f}]; {run['seconds'] / 60:.1f} min")
    finally:
        removed = remove_refs(repo, [ref_name(0), *map(ref_name,
                                                        record["busy_wait_us"].values())])
        if removed:
            progress(f"removed the scratch refs: {', '.join(removed)}")
    record["complete"] = True
    write_json_atomic(out / RECORD, record, compact=True)
    partial.unlink(missing_ok=True)
    return record


SMOKE = CalibrationPlan(runs=1, gate=GatePlan(rounds=20, warmup=2, rule=StoppingRule.up_to(2)))


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m openclaw_ref.bench.gate.calibrate",
                                description="the regression gate's own error rates "
                                            "(tox -e gate-calibrate)")
    full = CalibrationPlan()
    p.add_argument("--runs", type=int, default=full.runs, help="gate runs per condition")
    p.add_argument("--jobs", type=int, default=full.gate.max_jobs,
                   help="the most jobs a gate run takes")
    p.add_argument("--rounds", type=int, default=full.gate.rounds,
                   help="timed rounds per job")
    p.add_argument("--out", default="results/gate", help="where the record and table go")
    p.add_argument("--smoke", action="store_true",
                   help="1 run per condition, 2 jobs of 20 rounds, into a temporary directory "
                        "(never results/): checks the command, measures nothing")
    p.add_argument("--render", action="store_true",
                   help="only re-render the table, the docs blocks and the README's gate line "
                        "from the record in --out (or say not measured yet, without one)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    repo = Path(".")
    try:
        if args.render:
            published = read_calibration(Path(args.out) / RECORD)
            if published is not None:
                publish(published, Path(args.out), repo)
            else:
                render_blocks(None, repo)
            return 0
        plan = SMOKE if args.smoke else CalibrationPlan(
            runs=args.runs, gate=GatePlan(rounds=args.rounds,
                                          rule=StoppingRule.up_to(args.jobs)))
        out = Path(tempfile.mkdtemp(prefix="gate-smoke-")) if args.smoke else Path(args.out)
        total = plan.runs * len(plan.conditions)
        print(f"gate-calibrate: {total} gate runs of up to {plan.gate.max_jobs} jobs × "
              f"{plan.gate.rounds} rounds → {out}; at most ~{plan.estimate_s() / 60:.0f} min on "
              f"2 idle cores (runs that stop early take less)", flush=True)
        record = calibrate(repo, out, plan, lambda m: print(m, flush=True))
        if args.smoke:
            record["smoke"] = True
            write_json_atomic(out / RECORD, record, compact=True)
            write_text_atomic(out / "calibration.md", render(record))
        else:
            publish(record, out, repo)
    except BadInput as exc:
        print(f"gate-calibrate: {exc}", file=sys.stderr)
        return 2
    print(render(record), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
