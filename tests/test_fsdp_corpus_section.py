"""The comparison's ``fsdp_corpus`` section: the published FSDP2 mistakes under stock FSDP2 and
``harden()``'s defaults. Its table is rendered from a hand-written record (figures only, every
word from the renderer); the section is registered wherever the other sections are; how one
rank stopped is named as an identifier. One real run of the section's quick subset (two
torchrun jobs, ~30 s on 2 cores) is behind ``slow``; ``tests/test_fsdp_corpus.py`` asserts
each column's outcomes."""

from __future__ import annotations

import pytest

from openclaw_ref.cli import choices
from openclaw_ref.experiments import registry
from openclaw_ref.experiments.sections import fsdp_corpus
from openclaw_ref.experiments.settings import CompareConfig, quick_config
from openclaw_ref.fsdp_corpus.outcome import RankResult, Status, classify, error_class
from openclaw_ref.fsdp_corpus.patterns import CLEAN, PATTERNS, Column, Mesh
from openclaw_ref.reporting import record
from openclaw_ref.reporting.fsdp_tables import fsdp_corpus_cell, fsdp_corpus_tables
from openclaw_ref.reporting.section_tables import SECTION_TABLES

SETTINGS = {"steps": 6, "fault_step": 2, "fault_rank": 1, "timeout_s": 10.0,
            "batch_per_rank": 16}


def _case(pattern: str, column: str, outcome: str, error=None, step=None, ranks=(),
          max_abs_diff=None) -> dict:
    return {"pattern": pattern, "column": column, "mesh": "fsdp", "world_size": 2,
            "outcome": outcome, "error": error, "step": step, "ranks": list(ranks),
            "max_abs_diff": max_abs_diff}


SECTION = {
    "settings": SETTINGS,
    "patterns": [{"name": "none", "source": None, "url": None},
                 {"name": "optimizer-before-shard", "source": "pytorch#149205",
                  "url": "https://github.com/pytorch/pytorch/issues/149205"},
                 {"name": "no-sync-one-rank", "source": "no public report found", "url": None}],
    "cases": [
        _case("none", "stock", "no-effect", max_abs_diff=0.0),
        _case("optimizer-before-shard", "stock", "silent-corruption", max_abs_diff=0.0123),
        _case("no-sync-one-rank", "stock", "hang-timeout", "RuntimeError", 2, [0, 1]),
        _case("none", "hardened", "no-effect", max_abs_diff=0.0),
        _case("optimizer-before-shard", "hardened", "detected", "OptimizerMismatch", 0, [0, 1]),
        _case("no-sync-one-rank", "hardened", "crash", "SIGABRT", 5, [1]),
    ],
}


# --- the table, from a hand-written record -----------------------------------------------------

def test_the_table_is_pattern_source_stock_and_hardened_with_a_row_per_pattern():
    [table] = fsdp_corpus_tables(SECTION, {})
    assert table.headers == ["pattern", "public source", "stock FSDP2", "harden() defaults"]
    assert table.rows == [
        ["none", "— (the script without a mistake)", "no-effect", "no-effect"],
        ["optimizer-before-shard", "[pytorch#149205](https://github.com/pytorch/pytorch/issues/"
         "149205)", "silent-corruption (max Δ 1.2e-02)",
         "detected (OptimizerMismatch; step 0; ranks 0,1)"],
        ["no-sync-one-rank", "no public report found",
         "hang-timeout (RuntimeError; step 2; ranks 0,1)", "crash (SIGABRT; step 5; rank 1)"],
    ]


def test_the_caption_says_mesh_ranks_steps_and_how_many_each_column_caught():
    [table] = fsdp_corpus_tables(SECTION, {})
    for said in ("6-step run", "on 2 gloo ranks", "a 1-D mesh", "acts on rank 1",
                 "from step 2", "timeout 10 s", "harden(model) right after fully_shard",
                 "Caught: stock FSDP2 0 of 2, harden() defaults 1 of 2."):
        assert said in table.caption, said
    assert table.markdown().startswith(f"**{table.caption}**")


def test_no_cell_holds_a_pipe_that_would_split_the_markdown_table():
    [table] = fsdp_corpus_tables(SECTION, {})
    assert all("|" not in str(cell) for row in table.rows for cell in row[2:])


def test_one_table_per_mesh_and_world_size():
    hsdp = [{**c, "mesh": "hsdp", "world_size": 4} for c in SECTION["cases"]]
    tables = fsdp_corpus_tables({**SECTION, "cases": SECTION["cases"] + hsdp}, {})
    assert len(tables) == 2 and "on 4 gloo ranks" in tables[1].caption
    assert "an HSDP mesh (2 replicas × 2 shards)" in tables[1].caption


def test_a_detection_says_which_ranks_gloo_ended_meanwhile():
    ended = {**_case("x", "hardened", "detected", "MissingGradient", 2, [1]),
             "failed_error": "SIGABRT", "failed_ranks": [1]}
    assert fsdp_corpus_cell(ended) == \
        "detected (MissingGradient; step 2; rank 1; rank 1 ended by SIGABRT)"


def test_a_cell_without_an_error_step_or_ranks_is_the_outcome_alone():
    assert fsdp_corpus_cell(_case("x", "stock", "silent-corruption")) == "silent-corruption"
    assert fsdp_corpus_cell({**_case("x", "stock", "silent-corruption", max_abs_diff=0.5),
                             "replicas_differ": True}) == \
        "silent-corruption (replicas differ; max Δ 5.0e-01)"
    assert fsdp_corpus_cell(_case("x", "stock", "crash", "exit 1", None, [0])) == \
        "crash (exit 1; rank 0)"
    assert fsdp_corpus_cell(_case("x", "hardened", "detected", "ParameterMismatch", None, [1])) \
        == "detected (ParameterMismatch; at harden(); rank 1)"


# --- registered wherever the other sections are ------------------------------------------------

def test_the_section_is_registered_recorded_offered_by_the_cli_and_rendered():
    assert "fsdp_corpus" in registry.SECTIONS and "fsdp_corpus" in record.SECTIONS
    assert "fsdp_corpus" in choices.SECTIONS and "fsdp_corpus" in SECTION_TABLES
    assert "fsdp_corpus" in CompareConfig().sections
    names = list(registry.SECTIONS)
    assert names.index("fsdp_corpus") > names.index("fsdp_cost")  # runs after fsdp_cost


def test_every_pattern_runs_once_and_the_hang_runs_last():
    assert sorted(fsdp_corpus.RUN_ORDER) == sorted((CLEAN, *PATTERNS))
    assert fsdp_corpus.RUN_ORDER[0] == CLEAN and fsdp_corpus.RUN_ORDER[-1] == "no-sync-one-rank"
    quick = fsdp_corpus.patterns_of(quick_config())
    assert set(quick) < set(fsdp_corpus.patterns_of(CompareConfig())) and quick[0] == CLEAN
    assert fsdp_corpus.meshes_of(CompareConfig()) == ((Mesh.FSDP, 2), (Mesh.HSDP, 4))
    assert fsdp_corpus.meshes_of(quick_config()) == ((Mesh.FSDP, 2),)


def test_a_case_keeps_figures_and_drops_the_outcomes_wording():
    outcome = {"pattern": "lr-one-rank", "kind": "detected", "ranks": [1], "step": 2,
               "detail": "OptimizerMismatch at step 2 …", "max_abs_diff": None,
               "per_rank": {"0": "detected", "1": "detected"}, "error": "OptimizerMismatch"}
    case = fsdp_corpus.case_figures("lr-one-rank", Column.HARDENED, Mesh.FSDP, 2, outcome)
    assert case == {"pattern": "lr-one-rank", "column": "hardened", "mesh": "fsdp",
                    "world_size": 2, "outcome": "detected", "error": "OptimizerMismatch",
                    "step": 2, "ranks": [1], "max_abs_diff": None, "replicas_differ": False,
                    "failed_error": None, "failed_ranks": []}
    assert fsdp_corpus.pattern_figures("no-sync-one-rank")["url"] is None


# --- how a rank stopped, as an identifier --------------------------------------------------------

def _res(rank: int, status: Status, **kw) -> RankResult:
    return RankResult(rank, "p", status, 2, **kw)


def test_error_class_names_the_exception_the_signal_or_the_watchdog():
    assert error_class(_res(0, Status.ERROR, error="RuntimeError: Timed out"), None, False) == \
        "RuntimeError"
    assert error_class(_res(0, Status.WATCHDOG), None, False) == "watchdog"
    assert error_class(None, "died by SIGABRT: size mismatch", False) == "SIGABRT"
    assert error_class(None, "exited with code 1", False) == "exit 1"
    assert error_class(None, None, True) == "deadline"
    assert error_class(None, None, False) == "died"


def test_classify_names_the_error_of_a_detection_and_of_the_first_named_rank():
    det = {"kind": "ClockMismatch", "step": 2, "ranks": [1], "detail": "…"}
    out = classify("p", {r: _res(r, Status.DETECTED, detection=det) for r in (0, 1)}, "a")
    assert out.error == "ClockMismatch" and out.to_json()["error"] == "ClockMismatch"
    out = classify("p", {0: None, 1: _res(1, Status.ERROR, error="RuntimeError: Connection "
                                                                  "reset by peer")},
                   None, lost={0: "died by SIGABRT"})
    assert out.ranks == [0] and out.error == "SIGABRT"
    same = {r: _res(r, Status.FINISHED, digest="a") for r in (0, 1)}
    assert classify("p", same, "a").error is None


def test_a_detection_on_one_rank_keeps_how_gloo_ended_the_other():
    det = {"kind": "MissingGradient", "step": 2, "ranks": [1], "detail": "…"}
    out = classify("p", {0: _res(0, Status.DETECTED, detection=det), 1: None}, "a",
                   lost={1: "died by SIGABRT"})
    assert (out.kind.value, out.ranks, out.failed_ranks, out.failed_error) == \
        ("detected", [1], [1], "SIGABRT")
    both = classify("p", {r: _res(r, Status.DETECTED, detection=det) for r in (0, 1)}, "a")
    assert both.failed_ranks == [] and both.failed_error is None


# --- one real run of the quick subset ---------------------------------------------------------

class _Ticks:
    def __init__(self) -> None:
        self.said: list[str] = []

    def tick(self, what: str) -> None:
        self.said.append(what)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_quick_subset_runs_both_columns_and_renders():
    ticks = _Ticks()
    sec = fsdp_corpus.run(quick_config(), None, ticks)
    assert len(ticks.said) == fsdp_corpus.jobs(quick_config())
    cell = {(c["pattern"], c["column"]): c for c in sec["cases"]}
    assert cell[("none", "stock")]["outcome"] == "no-effect"
    assert cell[("optimizer-before-shard", "stock")]["outcome"] == "silent-corruption"
    assert cell[("extra-backward-one-rank", "stock")]["outcome"] == "crash"
    hardened = cell[("extra-backward-one-rank", "hardened")]
    assert (hardened["outcome"], hardened["error"], hardened["ranks"]) == \
        ("detected", "ClockMismatch", [0, 1])  # two ranks, no majority: both
    [table] = fsdp_corpus_tables(sec, {})
    assert "Caught: stock FSDP2 0 of 2, harden() defaults 2 of 2." in table.caption
