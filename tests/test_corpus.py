"""The real-world corpus: each published DDP silent-error pattern is caught by the column that
catches it (``harden()`` defaults: gradients never averaged, a registration order that
differs, and replicas drifting outside the allreduce within the default replica window; the
every-step window K = 1 catches the drift on the next step), on the plain
user script and on the openclaw model, naming the rank and cause; the clean runs stay silent.
``data-not-sharded`` is caught by no column (docs/hardening.md, "What it does not catch")."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from openclaw_ref.arms.config import ArmConfig
from openclaw_ref.conformance.corpus import (
    DEFAULT_WINDOW,
    SCRIPT_MODULE,
    SCRIPT_STEPS,
    Column,
    CorpusRunner,
    CorpusSettings,
    hardened_defaults,
    hardened_k1,
    script_task,
    steps_to_detect,
    user_script,
)
from openclaw_ref.core.corpus_faults import CORPUS, PATTERNS, pattern
from openclaw_ref.reporting.corpus_tables import corpus_cell, corpus_tables
from tests.helpers import ROOT

# What catches each pattern today, and the check that fires.
CAUGHT_AT_DEFAULTS = {"convert-after-wrap": "GradientsNotAveraged",
                      "forward-via-module": "GradientsNotAveraged",
                      "param-replaced-after-wrap": "GradientsNotAveraged",
                      "layer-order": "ParameterMismatch"}
DRIFT = ("clip-one-rank", "lr-off-by-one", "skip-step-one-rank",
                  "scaler-state-differs", "load-on-rank0-after-wrap")
UNCAUGHT = ("data-not-sharded",)


@pytest.fixture(scope="module")
def script_runner(pools):
    return CorpusRunner(CorpusSettings(), pools.get, script=True)


def test_the_corpus_has_ten_patterns_each_citing_a_public_source():
    assert len(CORPUS) >= 10 and len(PATTERNS) == len(CORPUS)
    assert all(p.url.startswith("https://github.com/") and p.source for p in CORPUS)
    assert set(CAUGHT_AT_DEFAULTS) | set(DRIFT) | set(UNCAUGHT) == set(PATTERNS)


def test_the_user_script_reproduces_every_corpus_pattern():
    assert user_script().PATTERNS == ("none", *PATTERNS)


def test_the_hardened_columns_are_harden_defaults_and_the_every_step_window():
    assert hardened_defaults() == ArmConfig(name="hardened")
    assert hardened_k1().harden.replica_slices == 1


@pytest.mark.parametrize("column", ["ddp", "ddp-detail", "hardened", "hardened-k1"])
def test_the_clean_user_script_stays_silent(pools, column):
    kind, record = pools.get(2).run(script_task, ("none", column, SCRIPT_STEPS), timeout_s=60)[0]
    assert kind == "ok", record
    assert record["summary"]["replicas_equal"]


@pytest.mark.parametrize("name", sorted(CAUGHT_AT_DEFAULTS))
def test_harden_defaults_catch_the_pattern_in_the_user_script(script_runner, name):
    out = script_runner.run_case(Column.HARDENED, name)
    assert out.outcome == "detected" and out.kind == CAUGHT_AT_DEFAULTS[name], out.detail
    assert out.attributed and steps_to_detect(out, pattern(name)) in (None, 0)


@pytest.mark.parametrize("name", DRIFT)
def test_the_every_step_replica_window_catches_the_drift_in_the_user_script(script_runner,
                                                                            name):
    out = script_runner.run_case(Column.HARDENED_K1, name)
    assert out.outcome == "detected" and out.kind == "ReplicaDivergence", out.detail
    assert out.ranks and steps_to_detect(out, pattern(name)) <= 1
    if name != "load-on-rank0-after-wrap":  # 2 ranks: no majority to name rank 0 against
        assert out.attributed


@pytest.mark.parametrize("name", DRIFT)
def test_harden_defaults_catch_the_drift_within_the_replica_window(script_runner, name):
    out = script_runner.run_case(Column.HARDENED, name)
    assert out.outcome == "detected" and out.kind == "ReplicaDivergence", out.detail
    assert out.ranks and steps_to_detect(out, pattern(name)) <= DEFAULT_WINDOW
    if name != "load-on-rank0-after-wrap":
        assert out.attributed and out.in_time


def test_unsharded_data_is_caught_by_no_column(script_runner):
    out = script_runner.run_case(Column.HARDENED_K1, "data-not-sharded")
    assert out.outcome == "silent-corruption" and "differs" in out.detail


def test_stock_ddp_is_silent_when_gradients_are_never_averaged(script_runner):
    assert script_runner.run_case(Column.STOCK, "convert-after-wrap").outcome == \
        "silent-corruption"


@pytest.fixture(scope="module")
def model_runner(pools):
    return CorpusRunner(CorpusSettings(), pools.get)


def test_harden_defaults_catch_a_conversion_after_wrapping_on_the_openclaw_model(model_runner):
    out = model_runner.run_case(Column.HARDENED, "convert-after-wrap")
    assert out.outcome == "detected" and out.kind == "GradientsNotAveraged", out.detail
    assert out.attributed and out.step == 0


def test_the_replica_window_catches_one_rank_clipping_on_the_openclaw_model(model_runner):
    out = model_runner.run_case(Column.HARDENED_K1, "clip-one-rank")
    assert out.outcome == "detected" and out.kind == "ReplicaDivergence", out.detail
    assert out.ranks == [0, 1] and steps_to_detect(out, pattern("clip-one-rank")) == 1


@pytest.mark.slow
def test_full_corpus_on_the_openclaw_model(model_runner):
    for p in CORPUS:
        outcomes = {c: model_runner.run_case(c, p.name) for c in Column}
        assert outcomes[Column.STOCK].outcome == "silent-corruption", p.name
        k1 = outcomes[Column.HARDENED_K1]
        if p.name in UNCAUGHT:
            assert k1.outcome == "silent-corruption", p.name
        else:
            assert k1.outcome == "detected", (p.name, k1.detail)
        if p.name not in UNCAUGHT:
            assert outcomes[Column.HARDENED].outcome == "detected", p.name


def _torchrun_script(*args: str) -> dict:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
           "2", "-m", SCRIPT_MODULE, *args]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=180, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_the_user_script_under_torchrun_reports_the_detection():
    out = _torchrun_script("--pattern", "forward-via-module", "--column", "hardened")
    assert out["outcome"] == "detected" and out["kind"] == "GradientsNotAveraged"
    assert out["step"] == 0 and out["ranks"] == [0, 1]  # every rank bypassed DDP


@pytest.mark.slow
def test_the_clean_user_script_under_torchrun_finishes_with_equal_replicas():
    out = _torchrun_script("--pattern", "none", "--column", "hardened")
    assert out["outcome"] == "finished" and out["replicas_equal"]


def test_a_detection_cell_says_the_check_the_delay_and_the_ranks():
    case = {"outcome": "detected", "kind": "ReplicaDivergence", "steps_to_detect": 1,
            "ranks": [1]}
    assert corpus_cell(case) == "detected (ReplicaDivergence; +1 step; ranks 1)"
    assert corpus_cell({"outcome": "silent-corruption"}) == "silent-corruption"


def test_the_corpus_table_cites_each_source_and_counts_the_catches():
    p = CORPUS[0]
    sec = {"settings": {"world_size": 2, "train": {"steps": 6}, "script_steps": 8},
           "patterns": [{"name": p.name, "source": p.source, "url": p.url}],
           "cases": [{"model": "openclaw", "column": "ddp", "pattern": p.name,
                      "outcome": "silent-corruption"},
                     {"model": "openclaw", "column": "hardened", "pattern": p.name,
                      "outcome": "detected", "kind": "GradientsNotAveraged",
                      "steps_to_detect": 0, "ranks": [0]}]}
    (table,) = corpus_tables(sec, {})
    text = table.markdown()
    assert f"[{p.source}]({p.url})" in text
    assert "stock DDP 0 of 1, harden() defaults 1 of 1" in text
    assert "detected (GradientsNotAveraged; same step; ranks 0)" in text
