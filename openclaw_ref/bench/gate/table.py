"""The published table of the gate's error rates, rendered from the calibration's record
(never typed): ``results/gate/calibration.md`` and the block between ``BEGIN`` and ``END`` in
``docs/benchmarks.md``. ``python -m openclaw_ref.bench.gate.calibrate --render`` redoes both
from the committed record in a second.
"""

from __future__ import annotations

import statistics
from pathlib import Path

from tabulate import tabulate

from openclaw_ref.bench.gate.stat import SEE, TOLERANCE, Verdict
from openclaw_ref.reporting.table import replace_block

BEGIN = "<!-- gate-calibration: rendered from results/gate/calibration.json, do not edit -->"
END = "<!-- /gate-calibration -->"
NOT_MEASURED = "Not measured yet on this host: `tox -e gate-calibrate` writes the table here."
QUIET_TARGET_RUNS = 5  # 0 flags in at least this many identical-code runs
MINUTES_TARGET = 15.0  # per comparison, on 2 idle cores


def runs_of(record: dict, condition: str) -> list[dict]:
    return [r for r in record["runs"] if r["condition"] == condition]


def conditions(record: dict) -> list[str]:
    return list(dict.fromkeys(r["condition"] for r in record["runs"]))


def count(runs: list[dict], verdict: Verdict) -> int:
    return sum(r["verdict"] == verdict.value for r in runs)


def met(ok: bool) -> str:
    return "met" if ok else "missed"


def target(condition: str, runs: list[dict], see_name: str) -> str:
    """The issue's target for this row, and whether the runs meet it."""
    flagged = count(runs, Verdict.SLOWER)
    if condition == "identical":
        ok = flagged == 0 and len(runs) >= QUIET_TARGET_RUNS
        return f"0 in ≥ {QUIET_TARGET_RUNS}: {met(ok)}"
    if condition == see_name:
        ok = flagged == len(runs) and len(runs) >= QUIET_TARGET_RUNS
        return f"≥ {QUIET_TARGET_RUNS}/{QUIET_TARGET_RUNS}: {met(ok)}"
    return "reported"


def planted(runs: list[dict]) -> str:
    us = runs[0]["busy_wait_us"]
    if not us:
        return "none (a comment)"
    shares = [us / 1e3 / r["stock_step_ms"] for r in runs]
    return f"{us:,} µs ({min(shares):.1%}–{max(shares):.1%} of the run's DDP step)"


def row(condition: str, runs: list[dict], see_name: str) -> list[str]:
    points = [r["excess"]["point"] for r in runs]
    minutes = [r["seconds"] / 60 for r in runs]
    return [condition, planted(runs), f"{count(runs, Verdict.SLOWER)}/{len(runs)}",
            target(condition, runs, see_name), f"{count(runs, Verdict.NOISY)}",
            f"{statistics.median(points):+.4f} [{min(points):+.4f}, {max(points):+.4f}]",
            f"{sum(r['old_rule']['flagged'] for r in runs)}/{len(runs)}",
            f"{statistics.median(minutes):.1f} (max {max(minutes):.1f})"]


HEADERS = ["HEAD against", "planted per step", "flagged", "target", "noisy",
           "HEAD's excess, DDP steps: median [min, max]", "old rule flagged",
           "minutes per run"]


def caption(record: dict) -> str:
    plan, h = record["plan"], record["host"]
    gate = plan["gate"]
    loads = [r["load_before"][0] for r in record["runs"]]
    minutes = max(r["seconds"] / 60 for r in record["runs"])
    smoke = "**SMOKE RUN: not results.** " if record.get("smoke") else ""
    return (f"{smoke}The regression gate's own error rates: `tox -e bench-gate`, "
            f"{plan['runs']} runs per row, the calibrated commit `{record['head'][:10]}` "
            f"(checkout {record['checkout'][:10]}) as BASE against a scratch commit on it as "
            f"HEAD; a run is {gate['jobs']} fresh job(s) × {gate['steps']} timed steps per arm "
            f"(stock DDP, BASE's and HEAD's `harden()`, 2 gloo ranks, the MLP). Flagged: the "
            f"verdict *slower* (HEAD adds ≥ {TOLERANCE:.3f} of a stock DDP step and its 95 % "
            f"interval lies above 0); noisy: not flagged, but a slowdown of {SEE:.2f} fits the "
            f"interval. Old rule: the gate before (hardened ÷ ddp grown by over 1.05×) on the "
            f"same jobs. Plants sized from the first run's stock DDP step, "
            f"{record['stock_step_ms']:.1f} ms. Host: {h['cpu_model']}, {h['cpu_count']} cores, "
            f"torch {h['torch']}, {h['date'][:10]}; 1-min load average before a run "
            f"{min(loads):.1f}–{max(loads):.1f}; slowest run {minutes:.1f} min (target "
            f"≤ {MINUTES_TARGET:.0f} on 2 idle cores: {met(minutes <= MINUTES_TARGET)}).")


def render(record: dict) -> str:
    """The table with its caption, as markdown."""
    see_name = f"+{SEE:.0%}"
    rows = [row(c, runs_of(record, c), see_name) for c in conditions(record)]
    return f"{caption(record)}\n\n{tabulate(rows, HEADERS, tablefmt='github')}\n"


def with_block(page: str, body: str) -> str:
    """``page`` with the text between ``BEGIN`` and ``END`` replaced by ``body``."""
    return replace_block(page, BEGIN, END, body)


def block_of(page: str) -> str:
    return page[page.index(BEGIN) + len(BEGIN):page.index(END)].strip()


def publish(record: dict, out: Path, docs_page: Path) -> None:
    """Write ``out/calibration.md`` and the docs block from ``record`` — a finished record of
    a real run only (``BadInput`` for a smoke run's or a partial one)."""
    from openclaw_ref.core.jsonio import write_text_atomic
    from openclaw_ref.sync.errors import BadInput

    if record.get("smoke") or not record.get("complete"):
        raise BadInput("only a finished calibration is published (not a smoke run, not a "
                       "partial record)")
    text = render(record)
    write_text_atomic(out / "calibration.md", text)
    write_text_atomic(docs_page, with_block(docs_page.read_text(encoding="utf-8"), text))
