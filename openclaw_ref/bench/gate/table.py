"""What the gate says about itself, rendered from its calibration's record (never typed):
``results/gate/calibration.md``, the table in ``docs/benchmarks.md``, the README's line on the
gate and the last line the gate prints (``promise``). Until a calibration is published they say
its rates are not measured yet; once it is, they state the measured rates, whether the targets
were met or not — the gate promises only what the table shows.

Per planted size the table sets the planted µs beside the measured excess in µs (the mean of
the runs' excesses with a 95 % Student-t interval across the runs) and says whether the two
agree or by how much they differ. ``python -m openclaw_ref.bench.gate.calibrate --render``
redoes every rendered block from the committed record in a second.
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path

from tabulate import tabulate

from openclaw_ref.bench.gate.run import GatePlan
from openclaw_ref.bench.gate.stat import SEE, TOLERANCE, Verdict, job_median_ms, t_interval
from openclaw_ref.bench.gate.stopping import StoppingRule, operating
from openclaw_ref.core.jsonio import read_json, write_text_atomic
from openclaw_ref.reporting.blocks import rewrite
from openclaw_ref.sync.errors import BadInput

CALIBRATION = Path("results") / "gate" / "calibration.json"  # under the repository's root
DOCS_BLOCK, STOPPING_BLOCK, README_BLOCK = "gate-calibration", "gate-stopping", "gate"
SPREADS = (0.01, 0.02, 0.03)  # job-to-job spreads of the excess simulated, in stock DDP steps
EXCESSES = (0.0, 0.03, SEE, 2 * SEE)  # true excesses simulated
NOT_MEASURED = "Not measured yet on this host: `tox -e gate-calibrate` writes the table here."
RUNS_TARGET = 5  # runs per condition the targets are judged on, at least
MINUTES_TARGET = 4.0  # per comparison, on 2 idle cores
TOTAL_MINUTES_TARGET = 80.0  # the whole calibration


def targets(fraction: float, flagged: int, runs: int) -> str | None:
    """The target of the condition planted at ``fraction`` of a stock step (0: identical code),
    and whether ``flagged`` of ``runs`` meet it; None for a condition without a target."""
    enough = runs >= RUNS_TARGET
    if fraction == 0:
        return f"0 in ≥ {RUNS_TARGET}: {met(enough and flagged == 0)}"
    if abs(fraction - SEE) < 1e-9:
        return f"≥ 4/5: {met(enough and flagged >= 0.8 * runs)}"
    if abs(fraction - 2 * SEE) < 1e-9:
        return f"5/5: {met(enough and flagged == runs)}"
    return None


def markdown(rows: list[list[str]], headers: list[str]) -> str:
    """A github table of cells already formatted (tabulate must not re-read them as numbers)."""
    return tabulate(rows, headers, tablefmt="github", disable_numparse=True)


def met(ok: bool) -> str:
    return "met" if ok else "missed"


def runs_of(record: dict, condition: str) -> list[dict]:
    return [r for r in record["runs"] if r["condition"] == condition]


def conditions(record: dict) -> list[str]:
    return list(dict.fromkeys(r["condition"] for r in record["runs"]))


def count(runs: list[dict], verdict: Verdict) -> int:
    return sum(r["verdict"] == verdict.value for r in runs)


def measured_us(runs: list[dict]) -> tuple[float, float, float]:
    """The runs' excesses (µs): their mean with a 95 % t interval across runs (one run: its
    own interval)."""
    if len(runs) == 1:
        x = runs[0]["excess"]
        return x["us"], x["low_us"], x["high_us"]
    return t_interval([r["excess"]["us"] for r in runs], 0.95)


def agreement(planted: float, mean: float, low: float, high: float) -> str:
    """Whether the measured interval holds the planted µs, else by how much they differ."""
    if low <= planted <= high:
        return "agrees"
    ratio = f", {mean / planted:.2f}× planted" if planted else ""
    return f"differs by {mean - planted:+,.0f} µs{ratio}"


def condition_row(condition: str, runs: list[dict]) -> list[str]:
    us = runs[0]["busy_wait_us"]
    mean, low, high = measured_us(runs)
    flagged = count(runs, Verdict.SLOWER)
    minutes = [r["seconds"] / 60 for r in runs]
    return [condition, f"{us:,} µs" if us else "none (a comment)",
            f"{mean:+,.0f} [{low:+,.0f}, {high:+,.0f}]", agreement(us, mean, low, high),
            f"{flagged}/{len(runs)}", targets(runs[0]["fraction"], flagged, len(runs)) or "—",
            str(count(runs, Verdict.NOISY)),
            f"{statistics.median(minutes):.1f} (max {max(minutes):.1f})",
            f"{statistics.median(r['excess']['jobs'] for r in runs):g}"]


CONDITION_HEADERS = ["HEAD against", "planted per step", "measured excess per step, µs: mean "
                     "[95 % interval over the runs]", "planted vs measured", "flagged",
                     "target", "noisy", "minutes per run: median (max)", "jobs per run"]
RUN_HEADERS = ["HEAD against", "run", "load before", "verdict", "excess, µs [95 %]",
               "of a DDP step", "jobs", "stopped", "minutes"]


def run_row(run: dict) -> list[str]:
    x = run["excess"]
    return [run["condition"], str(run["index"] + 1), f"{run['load_before'][0]:.2f}",
            run["verdict"], f"{x['us']:+,.0f} [{x['low_us']:+,.0f}, {x['high_us']:+,.0f}]",
            f"{x['point']:+.4f}", str(x["jobs"]), run["stop"], f"{run['seconds'] / 60:.1f}"]


def total_minutes(record: dict) -> float:
    """The calibration's minutes: every run from its scratch commit to its verdict, summed
    over the sessions that made the record (a resumed one included)."""
    return record["wall_s"] / 60


def time_spent(record: dict) -> str:
    """Where the runs' seconds went, medians over the runs (the first job of a run also imports
    both libraries on the ranks): "" when the record has no job phases."""
    runs = [r for r in record["runs"] if r.get("jobs") and "phases" in r["jobs"][0]]
    if not runs:
        return ""
    first = [r["jobs"][0]["phases"] for r in runs]
    later = [j["phases"] for r in runs for j in r["jobs"][1:]] or first
    med = statistics.median
    return (f" Where a run's time went (medians): {med(r['start_s'] for r in runs):.1f} s "
            f"spawning the ranks; the first job's building (and imports) "
            f"{med(p['build_s'] for p in first):.1f} s, a later job's "
            f"{med(p['build_s'] for p in later):.1f} s; a job's rounds, warm-up included, "
            f"{med(p['steps_s'] for p in later):.1f} s; closing "
            f"{med(p['close_s'] for p in later):.2f} s.")


def looks(plan: dict) -> str:
    """How a run of ``plan`` (the record's) stops, in words."""
    early = plan["looks"][:-1]
    if not early:
        return "every run to its last job"
    return f"stopping after {', '.join(map(str, early))} jobs when clearly inside or beyond"


def caption(record: dict) -> str:
    plan, h = record["plan"]["gate"], record["host"]
    loads = [r["load_before"][0] for r in record["runs"]]
    slowest = max(r["seconds"] / 60 for r in record["runs"])
    smoke = "**SMOKE RUN: not results.** " if record.get("smoke") else ""
    return (f"{smoke}The regression gate's own error rates: `tox -e bench-gate` as users run "
            f"it, {record['plan']['runs']} run(s) per row, the calibrated commit "
            f"`{record['head'][:10]}` (checkout {record['checkout'][:10]}) as BASE against a "
            f"scratch commit on it as HEAD; a run is up to {plan['looks'][-1]} jobs × "
            f"{plan['rounds']} rounds (BASE's and HEAD's `harden()` taking turns, stock DDP "
            f"every {plan['stock_every']}th round; 2 gloo ranks, the MLP), {looks(plan)}. "
            f"Flagged: the "
            f"verdict *slower* (HEAD adds ≥ {TOLERANCE:.3f} of a stock DDP step and its 95 % "
            f"interval lies above 0); noisy: not flagged, but {SEE:.2f} fits the interval. "
            f"Planted: a busy-wait per step in the step guard, sized from the first run's stock "
            f"DDP step, {record['stock_step_ms']:.1f} ms. Host: {h['cpu_model']}, "
            f"{h['cpu_count']} cores, torch {h['torch']}, {h['date'][:10]}; 1-min load average "
            f"before a run {min(loads):.2f}–{max(loads):.2f}. Minutes: slowest run "
            f"{slowest:.1f} (target ≤ {MINUTES_TARGET:.0f}: {met(slowest <= MINUTES_TARGET)}), "
            f"the whole calibration {total_minutes(record):.0f} (target ≤ "
            f"{TOTAL_MINUTES_TARGET:.0f}: {met(total_minutes(record) <= TOTAL_MINUTES_TARGET)})."
            f"{time_spent(record)}")


def render(record: dict) -> str:
    """The table with its caption, and every run's row, as markdown."""
    rows = [condition_row(c, runs_of(record, c)) for c in conditions(record)]
    runs = [run_row(r) for r in record["runs"]]
    return (f"{caption(record)}\n\n{markdown(rows, CONDITION_HEADERS)}\n\n"
            f"Every run, in the order they ran:\n\n{markdown(runs, RUN_HEADERS)}\n")


def rates(record: dict) -> str:
    """``identical code 0/5 flagged, +3% 2/5, …``: every condition's flags."""
    parts = []
    for c in conditions(record):
        runs = runs_of(record, c)
        name = "identical code" if runs[0]["fraction"] == 0 else c
        parts.append(f"{name} {count(runs, Verdict.SLOWER)}/{len(runs)}")
    return parts[0] + " flagged, " + ", ".join(parts[1:]) if len(parts) > 1 else parts[0]


def promise(record: dict | None) -> str:
    """One sentence: what the gate's calibration measured — or that nothing is measured yet."""
    if record is None:
        return (f"its error rates and minutes are not measured yet (at most "
                f"~{GatePlan().estimate_s() / 60:.1f} min a comparison on 2 idle cores, "
                f"estimated; `tox -e gate-calibrate` measures both)")
    missed = [f"{c} ({t})" for c in conditions(record)
              for t in [targets(runs_of(record, c)[0]["fraction"],
                                count(runs_of(record, c), Verdict.SLOWER),
                                len(runs_of(record, c)))] if t and t.endswith("missed")]
    minutes = [r["seconds"] / 60 for r in record["runs"]]
    h = record["host"]
    return (f"its calibration ({h['date'][:10]}, {h['cpu_count']} {h['cpu_model']} cores, "
            f"{record['plan']['runs']} runs each): {rates(record)}; "
            f"{statistics.median(minutes):.1f} min a comparison (max {max(minutes):.1f}); "
            + ("targets met" if not missed else f"targets missed: {'; '.join(missed)}"))


def readme_line(record: dict | None) -> str:
    """The README's line on the gate, after the command: what it flags and what it measured."""
    return (f"fails when HEAD adds ≥ {TOLERANCE:.1%} of a stock DDP step per step; "
            f"{promise(record)}")


def read_calibration(path: Path) -> dict | None:
    """The published calibration at ``path``, or None where there is none."""
    return read_json(path) if path.is_file() else None


def identical_spread(record: dict | None) -> float | None:
    """The spread (sd) of the job medians of the identical-code runs, in stock DDP steps,
    pooled over those runs: the job-to-job noise the calibration measured."""
    runs = [] if record is None else [r for r in record["runs"] if r["fraction"] == 0]
    variances = []
    for r in runs:
        medians = [job_median_ms(j["step_ms"]["head"], j["step_ms"]["base"]) for j in r["jobs"]]
        if len(medians) >= 2:
            variances.append(statistics.variance(medians) / r["excess"]["stock_step_ms"] ** 2)
    return math.sqrt(statistics.fmean(variances)) if variances else None


def stopping_table(record: dict | None, runs: int = 20_000) -> str:
    """What the sequential rule gives up and saves, simulated (``stopping.operating``) at
    ``SPREADS`` and at the spread the calibration measured: flagged share beside the same runs
    taken to their last job, mean jobs, minutes."""
    plan, fixed = GatePlan(), StoppingRule.up_to(GatePlan().max_jobs, early=False)
    measured = identical_spread(record)
    spreads = [*SPREADS, *([measured] if measured else [])]
    rows, wrong = [], 0.0
    for sigma in spreads:
        for x in EXCESSES:
            seq, full = operating(plan.rule, x, sigma, runs), operating(fixed, x, sigma, runs)
            wrong = max(wrong, seq["wrong_early"])
            rows.append([f"{sigma:.4f}" + (" (measured)" if sigma is measured else ""),
                         f"+{x:.0%}" if x else "0", f"{seq['flagged']:.2%}",
                         f"{full['flagged']:.2%}", f"{seq['noisy']:.2%}",
                         f"{seq['mean_jobs']:.1f}",
                         f"{plan.estimate_s(seq['mean_jobs']) / 60:.1f}"])
    head = (f"Simulated by `stopping.operating` ({runs:,} runs per row; job medians normal "
            f"with the job-to-job spread in the first column, in stock DDP steps"
            + (", the last rows at the spread the calibration measured on identical code"
               if measured else "; the calibration's own spread is added once it is published")
            + f"): the rule as it runs — looks after {', '.join(map(str, plan.rule.looks))} "
            f"jobs — beside the same runs taken to their last job. Early stops on the wrong "
            f"side of the tolerance: at most {wrong:.2%} of runs in any row (bound "
            f"{plan.rule.early_error:.0%}). Minutes: `GatePlan.estimate_s` at the mean jobs, "
            f"on 2 idle cores.")
    headers = ["spread of job medians", "true excess", "flagged", "flagged, every job run",
               "noisy", "mean jobs", "~minutes"]
    return f"{head}\n\n{markdown(rows, headers)}\n"


def render_blocks(record: dict | None, repo: Path) -> list[Path]:
    """Rewrite every block the gate owns from ``record`` (None: not measured yet): the docs'
    table and simulation, the README's line."""
    docs, readme = repo / "docs" / "benchmarks.md", repo / "README.md"
    return [rewrite(docs, DOCS_BLOCK, render(record) if record else NOT_MEASURED),
            rewrite(docs, STOPPING_BLOCK, stopping_table(record)),
            rewrite(readme, README_BLOCK, readme_line(record))]


def publish(record: dict, out: Path, repo: Path) -> list[Path]:
    """Write ``out/calibration.md`` and every block from ``record`` — a finished record of a
    real run only (``BadInput`` for a smoke run's or a partial one)."""
    if record.get("smoke") or not record.get("complete"):
        raise BadInput("only a finished calibration is published (not a smoke run, not a "
                       "partial record)")
    return [write_text_atomic(out / "calibration.md", render(record)),
            *render_blocks(record, repo)]
