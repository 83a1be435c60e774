"""The speed targets and the README's cost line (``reporting.speed``): judged from the interval,
rendered from a record's hook-cost figures only, and written only from the published record."""

from __future__ import annotations

import json

import pytest

from openclaw_ref.reporting import speed
from openclaw_ref.reporting.blocks import begin, block_of, end, with_block
from openclaw_ref.reporting.record import load_record, parse_record
from tests.helpers import ROOT

PUBLISHED = ROOT / "results" / "cpu2-gloo" / "raw.json"


def test_a_target_is_met_only_when_the_whole_interval_is_under_it():
    assert speed.judged(1.01, 0.99, 1.02, 1.02) == "met"
    assert speed.judged(1.05, 1.021, 1.08, 1.02) == "not met"
    assert speed.judged(1.01, 0.99, 1.03, 1.02).startswith("not shown either way")


def test_the_cost_line_reads_every_figure_from_the_record():
    doc = json.loads(PUBLISHED.read_text())
    job = doc["hook_cost"]["jobs"]["mlp"]
    job["summary"]["hardened"].update(ratio=1.2345, ratio_low=1.2001, ratio_high=1.2999)
    next(p for p in job["pairs"] if p["arm"] == "hardened" and p["over"] == "floor").update(
        ratio=1.0111, ratio_low=1.0001, ratio_high=1.0199)
    line = speed.cost_line(parse_record(doc, source=speed.REFERENCE_MACHINE))
    assert "**1.011× [1.000, 1.020]**, target ≤ 1.02×: met" in line
    assert "÷ stock DDP **1.234× [1.200, 1.300]**" in line
    del doc["hook_cost"]
    assert speed.cost_line(parse_record(doc)).startswith("Not measured")


def test_only_the_reference_machines_full_record_rewrites_the_readme(tmp_path):
    readme = tmp_path / "README.md"
    page = f"x {begin(speed.README_BLOCK, 'r')}old{end(speed.README_BLOCK)} y\n"
    readme.write_text(page)
    doc = json.loads(PUBLISHED.read_text())
    assert speed.render_readme(parse_record(doc, source="cpu8-gloo"), readme) is None
    doc["meta"]["compare_config"]["quick"] = True
    assert speed.render_readme(parse_record(doc, source=speed.REFERENCE_MACHINE), readme) is None
    assert readme.read_text() == page
    rec = load_record(PUBLISHED)
    assert speed.render_readme(rec, readme) == readme
    assert readme.read_text().startswith("x <!--") and readme.read_text().endswith(" y\n")
    assert block_of(readme.read_text(), speed.README_BLOCK) == speed.cost_line(rec)


def test_a_block_is_replaced_inline_or_as_lines_and_a_missing_one_is_named():
    one = f"a {begin('n', 's')}old{end('n')} b"
    assert with_block(one, "n", "new") == f"a {begin('n', 's')}new{end('n')} b"
    lines = f"a\n{begin('n', 's')}\nold\n{end('n')}\n"
    assert with_block(lines, "n", "x\ny") == f"a\n{begin('n', 's')}\nx\ny\n{end('n')}\n"
    assert block_of(with_block(lines, "n", "x\ny"), "n") == "x\ny"
    with pytest.raises(KeyError, match="'m'"):
        block_of(lines, "m")
