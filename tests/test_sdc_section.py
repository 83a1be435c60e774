"""The comparison's ``sdc`` section: its tables are rendered from a hand-written record (figures
only, every word from the renderer), and the section is registered wherever the other sections
are. One real run of the section's quick subset (~40 s on 2 cores) is behind ``slow``;
``tests/test_sdc_corpus.py`` and ``tests/test_canary_healthy.py`` assert the outcomes."""

from __future__ import annotations

import pytest

from openclaw_ref.cli import choices
from openclaw_ref.experiments import registry
from openclaw_ref.experiments.sections import sdc
from openclaw_ref.experiments.settings import quick_config
from openclaw_ref.reporting import record
from openclaw_ref.reporting.sdc_tables import sdc_cell, sdc_tables
from openclaw_ref.reporting.section_tables import SECTION_TABLES

SECTION = {
    "settings": {"canary_every": 2, "steps": 8, "fault_step": 2, "fault_rank": "last"},
    "corpus": [
        {"world_size": 2, "fault": "sdc-ulp", "value": None, "column": c, "outcome": o,
         "error": e, "step": s, "ranks": r, "params": p, "fired": 9}
        for c, o, e, s, r, p in (
            ("stock DDP", "silent-corruption", None, None, [], []),
            ("harden(), canary off", "no-effect", None, None, [], []),
            ("harden(), canary on", "detected", "ComputeMismatch", 3, [0, 1], ["inp.weight"]))],
    "rates": [{"fault": "sdc-flip-low", "value": "0.2", "probes": 8, "named": 1, "reported": 5,
               "right_rank": 6, "wrong_rank": 0, "fired": 20}],
    "healthy": [{"job": "dropout", "alarms_off": 0, "alarms_on": 0, "probes": 3,
                 "bitwise_equal": True}],
    "noise": [{"model": "mlp", "precision": "fp32", "trials": 20, "healthy": 2e-9,
               "smallest_caught": 2.0 ** -9, "caught_distance": 7e-4, "rtol": 1e-5,
               "skipped": ""},
              {"model": "moe_router", "precision": "bf16 autocast", "trials": 0,
               "healthy": None, "smallest_caught": None, "caught_distance": None, "rtol": 0.0,
               "skipped": "RuntimeError: Index put requires the source and destination"}],
}


def test_the_corpus_table_has_a_column_per_watcher_and_names_rank_step_and_parameter():
    corpus, rates, healthy, noise = sdc_tables(SECTION, {})
    assert corpus.headers[-3:] == ["stock DDP", "harden(), canary off", "harden(), canary on"]
    assert corpus.rows == [[2, "sdc-ulp", "persistent 1-ulp error, every matmul",
                            "silent-corruption", "no-effect",
                            "detected (ComputeMismatch, step 3 = fault + 1, ranks 0, 1; "
                            "inp.weight)"]]
    assert rates.rows == [["sdc-flip-low", "0.2", 8, 1, 5, 6, 0, "75%", 20]]
    assert healthy.rows == [["dropout", 0, 0, 3, "yes"]]


def test_the_noise_table_gives_the_margin_and_the_smallest_fault_caught_or_why_not_run():
    noise = sdc_tables(SECTION, {})[3]
    assert noise.rows[0] == ["mlp", "fp32", "1e-05", "2e-09", "5000x", "2^-9 (0.0007)"]
    assert noise.rows[1][:2] == ["moe_router", "bf16 autocast"]
    assert noise.rows[1][-1].startswith("not run: the model itself fails so")


def test_a_cell_without_a_detection_is_its_outcome_and_what_the_canary_reported():
    assert sdc_cell(SECTION["corpus"][0], 2) == "silent-corruption"
    reported = {**SECTION["corpus"][0], "reported": 2}
    assert sdc_cell(reported, 2) == \
        "silent-corruption (reported 2× as a one-off on the faulty rank)"


def test_the_section_is_registered_everywhere_sections_are():
    assert "sdc" in registry.SECTIONS and "sdc" in record.SECTIONS
    assert "sdc" in SECTION_TABLES and "sdc" in choices.SECTIONS


@pytest.mark.slow
def test_the_quick_section_runs_and_the_canary_column_names_every_fault(pools):
    class Ticks:
        def tick(self, what: str) -> None:
            pass

    figures = sdc.run(quick_config(), pools, Ticks())
    on = [c for c in figures["corpus"] if c["column"] == "harden(), canary on"]
    persistent = [c for c in on if c["value"] is None]  # every call: named, both of two ranks
    assert persistent and all(c["outcome"] == "detected" and c["ranks"] == [0, 1]
                              for c in persistent)
    # whatever is named, the faulty rank is among those named (never another rank alone)
    assert all(1 in c["ranks"] for c in on if c["outcome"] == "detected")
    assert all(h["bitwise_equal"] and h["alarms_on"] == 0 for h in figures["healthy"])
    assert len(sdc_tables(figures, {})) == 4
