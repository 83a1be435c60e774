"""``openclaw-bench compare --quick``: every section on a representative subset at small
settings, written to a scratch directory (never under ``results/``), every rendered file
labelled a quick run. The whole quick run is ``slow``; CI runs its plan, its labels and a
two-section quick run through the CLI."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from openclaw_ref.conformance.fault_matrix import FAULTS, matrix_strategies
from openclaw_ref.core.corpus_faults import CORPUS
from openclaw_ref.experiments.registry import SECTIONS
from openclaw_ref.experiments.sections import corpus, faults, hook_cost, strategies
from openclaw_ref.experiments.settings import CompareConfig, quick_config
from openclaw_ref.reporting.comparison import QUICK_TITLE
from openclaw_ref.reporting.record import load_record
from openclaw_ref.reporting.render import render_all
from openclaw_ref.reporting.timeline import bucket_timeline
from tests.helpers import ROOT

PUBLISHED = ROOT / "results"


def _digest(root: Path) -> dict[str, str]:
    """Every file under ``root`` (relative path → sha256): what "unchanged" means."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def test_a_quick_run_plans_every_section_with_fewer_jobs_than_the_full_run():
    quick, full = quick_config(), CompareConfig()
    assert quick.quick and not full.quick and quick.sections == tuple(SECTIONS)
    q_variants, f_variants = strategies.variants_of(quick), strategies.variants_of(full)
    for name, section in SECTIONS.items():
        q, f = section.jobs(quick, q_variants), section.jobs(full, f_variants)
        assert 0 < q <= f, name
    assert sum(s.jobs(quick, q_variants) for s in SECTIONS.values()) < \
        sum(s.jobs(full, f_variants) for s in SECTIONS.values()) / 2


def test_each_catalogue_section_runs_a_named_subset_of_its_full_list_in_a_quick_run():
    quick, full = quick_config(), CompareConfig()
    assert faults.faults_of(full) == FAULTS and faults.columns_of(full) == matrix_strategies()
    assert set(faults.faults_of(quick)) < set(FAULTS)
    assert set(faults.columns_of(quick)) < set(matrix_strategies())
    assert corpus.patterns_of(full) == CORPUS
    assert {p.name for p in corpus.patterns_of(quick)} == set(corpus.QUICK_PATTERNS)
    assert set(hook_cost.models_of(quick)) < set(hook_cost.models_of(full))
    labels = {v.label for v in strategies.variants_of(quick)}
    assert labels == set(strategies.QUICK_VARIANTS)
    assert labels < {v.label for v in strategies.variants_of(full)}


def test_overrides_keep_a_quick_run_quick(tmp_path):
    cfg = quick_config(sections=("raw_allreduce",), out_root=str(tmp_path), quick=False)
    assert cfg.quick and cfg.sections == ("raw_allreduce",) and cfg.steps == 8


@pytest.fixture(scope="module")
def quick_render(tmp_path_factory) -> Path:
    """The published record, marked quick, rendered into a scratch directory."""
    out = tmp_path_factory.mktemp("quick") / "cpu2-gloo"
    out.mkdir()
    raw = json.loads((PUBLISHED / "cpu2-gloo" / "raw.json").read_text())
    raw["meta"]["compare_config"]["quick"] = True
    (out / "raw.json").write_text(json.dumps(raw))
    render_all(out)
    return out


def test_every_file_rendered_from_a_quick_record_says_it_is_a_quick_run(quick_render):
    for path in (quick_render / "comparison.md", quick_render / "claims.md",
                 quick_render.parent / "claims.md"):
        head = path.read_text().split("\n## ")[0]
        assert QUICK_TITLE in head and "compare --quick" in head, path


def test_the_plots_of_a_quick_record_differ_from_the_same_plots_of_a_full_one(quick_render):
    for name in ("step_times.png", "loss_curves.png", "bucket_timeline.png",
                 "overflow_vs_scale.png"):
        assert (quick_render / name).read_bytes() != (PUBLISHED / "cpu2-gloo" / name).read_bytes()


def test_the_published_files_carry_no_quick_label():
    for path in (PUBLISHED / "cpu2-gloo" / "comparison.md", PUBLISHED / "claims.md"):
        assert QUICK_TITLE not in path.read_text()


def _quick_cli(*args: str, timeout: float) -> tuple[subprocess.CompletedProcess, Path]:
    """``openclaw-bench compare --quick ARGS`` from the checkout; the run's directory."""
    proc = subprocess.run([sys.executable, "-m", "openclaw_ref", "compare", "--quick", *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    raw = re.search(r"^wrote (.+)/raw\.json$", proc.stdout, re.M)
    assert raw, proc.stdout
    return proc, Path(raw.group(1))


def test_a_quick_run_from_the_checkout_writes_a_temporary_directory_not_results():
    before = _digest(PUBLISHED)
    proc, out = _quick_cli("--sections", "raw_allreduce", "--backend", "gloo", timeout=300)
    try:
        assert not out.resolve().is_relative_to(PUBLISHED)
        assert QUICK_TITLE in (out / "comparison.md").read_text()
        assert "quick run: a representative subset of every section" in proc.stdout
        assert json.loads((out / "raw.json").read_text())["meta"]["compare_config"]["quick"]
    finally:
        shutil.rmtree(out.parent)
    assert _digest(PUBLISHED) == before


@pytest.mark.slow
@pytest.mark.timeout(1800)  # a few minutes on 2 idle cores; 13-16 on a shared, loaded host
def test_the_whole_quick_comparison_fills_every_table_and_plot_and_leaves_results_untouched(
        tmp_path):
    before = _digest(PUBLISHED)
    _, out = _quick_cli("--backend", "gloo", "--out-root", str(tmp_path), timeout=1700)
    raw = json.loads((out / "raw.json").read_text())
    assert [s["name"] for s in raw["meta"]["sections_run"]] == list(SECTIONS)
    md = (out / "comparison.md").read_text()
    assert QUICK_TITLE in md and "## Not run" not in md
    for name in ("step_times.png", "loss_curves.png", "bucket_timeline.png",
                 "overflow_vs_scale.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    timeline = bucket_timeline(load_record(out / "raw.json"))  # every bucket, sized, indexed
    assert timeline and len(timeline.buckets) >= 2 and timeline.sized
    assert _digest(PUBLISHED) == before
