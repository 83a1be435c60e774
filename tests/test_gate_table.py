"""What the gate says about itself (``bench.gate.table``): counted from the calibration record's
runs, never typed — the planted µs beside the measured, the targets met or missed, the README's
line and the gate's own last line promising only what was measured — and the committed pages'
blocks are the committed record's (or say not measured yet)."""

from __future__ import annotations

import json

import pytest

from openclaw_ref.bench.gate import table
from openclaw_ref.bench.gate.stat import Verdict
from openclaw_ref.reporting.blocks import begin, block_of, end
from openclaw_ref.sync.errors import BadInput
from tests.helpers import ROOT


def run_record(condition: str, verdict_: Verdict, us_measured: float, planted: int = 0,
               fraction: float = 0.0, index: int = 0) -> dict:
    x = {"us": us_measured, "low_us": us_measured - 300, "high_us": us_measured + 300,
         "point": us_measured / 40e3, "jobs": 6, "stock_step_ms": 40.0}
    return {"condition": condition, "index": index, "busy_wait_us": planted,
            "fraction": fraction, "stock_step_ms": 40.0, "verdict": verdict_.value,
            "excess": x, "stop": "at the last look", "seconds": 150.0,
            "old_rule": {"flagged": False}, "load_before": [0.3, 0.2, 0.1], "start_s": 3.0,
            "jobs": [{"step_ms": {"base": [30.0, 31.0], "head": [30.0 + d, 31.0 + d]},
                      "phases": {"build_s": b, "steps_s": 12.0, "close_s": 0.05}}
                     for d, b in ((0.2, 2.5), (-0.2, 0.5), (0.1, 0.5))]}


def record_of(runs: list[dict]) -> dict:
    return {"plan": {"runs": 5, "gate": {"rounds": 200, "looks": [4, 6], "stock_every": 4}},
            "head": "a" * 40, "checkout": "a" * 40, "stock_step_ms": 40.0, "runs": runs,
            "wall_s": sum(r["seconds"] for r in runs), "complete": True,
            "host": {"cpu_model": "cpu", "cpu_count": 2, "torch": "2.13.0",
                     "date": "2026-12-05"}}


def calibration(plus5: list[Verdict], identical_flags: int = 0) -> dict:
    runs = [run_record("identical", Verdict.SLOWER if i < identical_flags else Verdict.WITHIN,
                       10.0 * (i - 2), index=i) for i in range(5)]
    runs += [run_record("+5%", v, 2000.0 + 50 * (i - 2), 2000, 0.05, i)
             for i, v in enumerate(plus5)]
    runs += [run_record("+10%", Verdict.SLOWER, 2600.0 + 10 * i, 4000, 0.10, i)
             for i in range(5)]
    return record_of(runs)


def line(text: str, start: str) -> str:
    return next(row for row in text.splitlines() if row.startswith(start))


def test_the_table_counts_flags_and_judges_the_targets_from_the_runs():
    text = table.render(calibration([Verdict.SLOWER] * 4 + [Verdict.NOISY]))
    identical, five = line(text, "| identical"), line(text, "| +5%")
    assert "0/5" in identical and "0 in ≥ 5: met" in identical
    assert "4/5" in five and "≥ 4/5: met" in five and "2,000 µs" in five
    assert "5/5: met" in line(text, "| +10%")
    assert "0 in ≥ 5: missed" in line(table.render(calibration([Verdict.SLOWER] * 5, 1)),
                                       "| identical")
    assert "≥ 4/5: missed" in line(table.render(calibration([Verdict.SLOWER] * 3 + [
        Verdict.WITHIN] * 2)), "| +5%")


def test_each_planted_size_shows_the_planted_beside_the_measured_us():
    text = table.render(calibration([Verdict.SLOWER] * 5))
    assert "| 2,000 µs " in line(text, "| +5%") and "+2,000 [" in line(text, "| +5%")
    assert "agrees" in line(text, "| +5%") and "agrees" in line(text, "| identical")
    assert "differs by -1,380 µs, 0.66× planted" in line(text, "| +10%")
    assert table.agreement(500, 260, 100, 420) == "differs by -240 µs, 0.52× planted"


def test_the_caption_says_where_a_runs_time_went():
    text = table.render(calibration([Verdict.SLOWER] * 5))
    assert ("3.0 s spawning the ranks; the first job's building (and imports) 2.5 s, a later "
            "job's 0.5 s; a job's rounds, warm-up included, 12.0 s; closing 0.05 s.") in text
    assert "the whole calibration 38 (target ≤ 80: met)" in text


def test_every_run_has_its_row_with_verdict_minutes_and_load():
    text = table.render(calibration([Verdict.SLOWER] * 5))
    rows = [r for r in text.split("Every run")[1].splitlines() if r.startswith("| +5%")]
    cells = [[c.strip() for c in r.split("|")[1:-1]] for r in rows]
    assert [c[1] for c in cells] == ["1", "2", "3", "4", "5"]
    assert all(c[2] == "0.30" and c[3] == "slower" and c[-1] == "2.5" for c in cells)


def test_the_promise_states_the_measured_rates_and_the_targets_missed():
    met = table.promise(calibration([Verdict.SLOWER] * 5))
    assert "identical code 0/5 flagged, +5% 5/5, +10% 5/5" in met and met.endswith("targets met")
    missed = table.promise(calibration([Verdict.SLOWER] * 3 + [Verdict.NOISY] * 2))
    assert "+5% 3/5" in missed and "targets missed: +5% (≥ 4/5: missed)" in missed
    assert "not measured yet" in table.promise(None)
    assert table.readme_line(None).startswith("fails when HEAD adds ≥ 2.5% of a stock DDP step")


def test_a_smoke_or_partial_record_is_never_published(tmp_path):
    (tmp_path / "docs").mkdir()
    page = (f"x\n{begin(table.DOCS_BLOCK, 's')}\nold\n{end(table.DOCS_BLOCK)}\n"
            f"{begin(table.STOPPING_BLOCK, 's')}\nold\n{end(table.STOPPING_BLOCK)}\n")
    (tmp_path / "docs" / "benchmarks.md").write_text(page)
    (tmp_path / "README.md").write_text(f"a {begin(table.README_BLOCK, 's')}o"
                                        f"{end(table.README_BLOCK)} b\n")
    good = calibration([Verdict.SLOWER] * 5)
    for bad in ({**good, "smoke": True}, {**good, "complete": False}):
        with pytest.raises(BadInput):
            table.publish(bad, tmp_path, tmp_path)
    table.publish(good, tmp_path, tmp_path)
    docs = (tmp_path / "docs" / "benchmarks.md").read_text()
    assert block_of(docs, table.DOCS_BLOCK) == table.render(good).strip()
    assert "(measured)" in block_of(docs, table.STOPPING_BLOCK)
    assert block_of((tmp_path / "README.md").read_text(), table.README_BLOCK) == \
        table.readme_line(good)
    assert (tmp_path / "calibration.md").read_text() == table.render(good)


def test_the_committed_pages_blocks_are_the_published_record_or_say_not_measured():
    published = table.read_calibration(ROOT / table.CALIBRATION)
    docs, readme = (ROOT / "docs" / "benchmarks.md").read_text(), (ROOT / "README.md").read_text()
    assert block_of(docs, table.DOCS_BLOCK) == (table.render(published).strip() if published
                                                else table.NOT_MEASURED)
    assert block_of(docs, table.STOPPING_BLOCK) == table.stopping_table(published).strip()
    assert block_of(readme, table.README_BLOCK) == table.readme_line(published)
    if published is None:
        assert "not measured yet" in block_of(readme, table.README_BLOCK)
    else:
        assert json.loads((ROOT / table.CALIBRATION).read_text())["complete"]
