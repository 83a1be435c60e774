"""The published table of the gate's error rates (``bench.gate.table``): counted from the
calibration record's runs, never typed, and the docs block is the committed record's."""

from __future__ import annotations

import json

import pytest

from openclaw_ref.bench.gate import table
from openclaw_ref.bench.gate.stat import Verdict
from openclaw_ref.sync.errors import BadInput
from tests.helpers import ROOT


def run_record(condition: str, verdict_: Verdict, point: float, us: int = 0) -> dict:
    return {"condition": condition, "index": 0, "busy_wait_us": us, "stock_step_ms": 40.0,
            "verdict": verdict_.value, "excess": {"point": point}, "seconds": 420.0,
            "old_rule": {"flagged": False}, "load_before": [0.3, 0.2, 0.1]}


def record_of(runs: list[dict]) -> dict:
    return {"plan": {"runs": 5, "gate": {"jobs": 4, "steps": 800}}, "head": "a" * 40,
            "checkout": "a" * 40, "stock_step_ms": 40.0, "runs": runs,
            "host": {"cpu_model": "cpu", "cpu_count": 2, "torch": "2.13.0", "date": "2026-12-05"}}


def test_the_table_counts_flags_and_targets_from_the_runs():
    runs = ([run_record("identical", Verdict.WITHIN, 0.001) for _ in range(5)]
            + [run_record("+5%", Verdict.SLOWER, 0.05, 2000) for _ in range(4)]
            + [run_record("+5%", Verdict.NOISY, 0.03, 2000)])
    text = table.render(record_of(runs))
    identical = next(line for line in text.splitlines() if line.startswith("| identical"))
    five = next(line for line in text.splitlines() if line.startswith("| +5%"))
    assert "0/5" in identical and "0 in ≥ 5: met" in identical
    assert "4/5" in five and "≥ 5/5: missed" in five and "2,000 µs (5.0%–5.0%" in five
    flagged_once = [run_record("identical", Verdict.SLOWER, 0.03)] + runs[1:]
    assert "0 in ≥ 5: missed" in table.render(record_of(flagged_once))


def test_a_smoke_or_partial_record_is_never_published(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(f"x\n{table.BEGIN}\nold\n{table.END}\n")
    runs = [run_record("identical", Verdict.WITHIN, 0.0)]
    for bad in ({**record_of(runs), "complete": True, "smoke": True}, record_of(runs)):
        with pytest.raises(BadInput):
            table.publish(bad, tmp_path, page)
    table.publish({**record_of(runs), "complete": True}, tmp_path, page)
    assert table.block_of(page.read_text()) == table.render(record_of(runs)).strip()
    assert (tmp_path / "calibration.md").read_text() == table.render(record_of(runs))


def test_the_docs_block_is_the_published_record_or_says_not_measured():
    page = (ROOT / "docs" / "benchmarks.md").read_text()
    published = ROOT / "results" / "gate" / "calibration.json"
    if published.exists():
        assert table.block_of(page) == table.render(json.loads(published.read_text())).strip()
    else:
        assert table.block_of(page) == table.NOT_MEASURED
    assert table.block_of(table.with_block(page, "new")) == "new"
