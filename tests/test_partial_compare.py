"""A partial ``compare --sections …`` merges into the record of its results directory: the
other sections, their verdicts and the plots drawn from them are kept; the sections it ran
carry their own environment; settings that differ from the record's are refused up front."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest

from openclaw_ref.core.jsonio import read_json
from openclaw_ref.experiments import compare
from openclaw_ref.experiments.compare import run_compare, write_results
from openclaw_ref.experiments.merge import conflicts
from openclaw_ref.experiments.settings import CompareConfig
from openclaw_ref.reporting.claims import assess_all
from openclaw_ref.reporting.plots import save, step_times_figure
from openclaw_ref.reporting.record import load_record
from openclaw_ref.sync.errors import BadInput
from tests.helpers import ROOT, partial_run

PUBLISHED = ROOT / "results" / "cpu2-gloo"
RERUN = ("raw_allreduce",)
RERUN_SHA = "0123456789abcdef0123456789abcdef01234567"
STALE_PNG = b"a plot of an older record"


def _published_copy(root: Path) -> Path:
    """The published record alone in a results directory, beside plots that are not its own."""
    out = root / "cpu2-gloo"
    out.mkdir(parents=True)
    shutil.copy(PUBLISHED / "raw.json", out / "raw.json")
    for png in PUBLISHED.glob("*.png"):
        (out / png.name).write_bytes(STALE_PNG)
    return out


@pytest.fixture(scope="module")
def merged(tmp_path_factory) -> tuple[dict, Path]:
    """(the published record as it was, the directory a partial run of RERUN was written to)."""
    out = _published_copy(tmp_path_factory.mktemp("results"))
    before = read_json(out / "raw.json")
    write_results(partial_run(load_record(out / "raw.json").doc, RERUN, RERUN_SHA), out)
    return before, out


def test_a_partial_compare_keeps_the_other_sections_of_the_record(merged):
    before, out = merged
    after = read_json(out / "raw.json")
    kept = [s for s in before if s not in (*RERUN, "meta", "doctor")]
    assert kept and all(after[s] == before[s] for s in kept)
    assert [e["name"] for e in after["meta"]["sections_run"]] == \
        [e["name"] for e in before["meta"]["sections_run"]]


def test_a_partial_compares_sections_carry_their_own_environment(merged):
    before, out = merged
    meta = read_json(out / "raw.json")["meta"]
    apart = before["meta"].get("section_runs", {})  # measured apart already (e.g. fsdp_cost)
    assert list(meta["section_runs"]) == sorted({*apart, *RERUN})
    assert meta["section_runs"]["raw_allreduce"]["environment"]["git_sha"] == RERUN_SHA
    assert all(meta["section_runs"][name] == run for name, run in apart.items())
    assert meta["environment"] == before["meta"]["environment"]


def test_the_rendered_documents_name_both_runs_the_sections_come_from(merged):
    before, out = merged
    base_sha = before["meta"]["environment"]["git_sha"]
    for document in ("comparison.md", "claims.md"):
        text = (out / document).read_text()
        assert base_sha in text and RERUN_SHA in text, document


def test_the_claims_of_sections_not_re_run_keep_their_verdicts(merged):
    before, out = merged
    verdicts = [(c.id, f.verdict) for c, f in assess_all(before)]
    assert [(c.id, f.verdict) for c, f in assess_all(load_record(out / "raw.json"))] == verdicts


def test_plots_are_rendered_from_the_merged_record(merged, tmp_path):
    _, out = merged
    pngs = sorted(out.glob("*.png"))
    assert pngs and all(p.read_bytes() != STALE_PNG for p in pngs)
    fresh = save(step_times_figure(load_record(out / "raw.json")), tmp_path / "step_times.png")
    assert (out / "step_times.png").read_bytes() == fresh.read_bytes()


def test_a_partial_compare_at_the_records_settings_has_no_conflict():
    rec = load_record(PUBLISHED / "raw.json")
    run = dataclasses.replace(CompareConfig(world_sizes=(1, 2, 4), backend="gloo"),
                              sections=RERUN)
    assert conflicts(rec, dataclasses.asdict(run), rec.meta["environment"]) == []


def test_a_partial_compare_at_other_settings_is_refused_before_any_process_starts(
        tmp_path, monkeypatch):
    out = _published_copy(tmp_path)
    before = (out / "raw.json").read_bytes()

    def no_processes(**_kw):
        raise AssertionError("a rank pool was started")

    monkeypatch.setattr(compare, "PoolCache", no_processes)
    cfg = CompareConfig(world_sizes=(2,), sections=RERUN, backend="gloo",
                        out_root=str(tmp_path), tag=out.name)
    with pytest.raises(BadInput, match=r"world_sizes: \[1, 2, 4\] → \[2\]"):
        run_compare(cfg)
    assert (out / "raw.json").read_bytes() == before
