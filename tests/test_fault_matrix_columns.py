"""The fault matrix's columns: which ran with settings other than their strategy's defaults is
recorded as figures and marked by the renderer, and ``hardened-defaults`` runs ``harden(model)``
exactly as users call it."""

from __future__ import annotations

import copy

from openclaw_ref.arms.config import ArmConfig, harden_defaults
from openclaw_ref.conformance.fault_matrix import (
    DEFAULTS,
    MatrixSettings,
    column_settings,
    matrix_strategies,
)
from openclaw_ref.experiments.sections import faults
from openclaw_ref.experiments.settings import CompareConfig
from openclaw_ref.reporting.section_tables import NON_DEFAULT, fault_tables

SETTINGS = MatrixSettings()


def _section(columns: tuple[str, ...]) -> dict:
    """A faults section as ``compare`` records it: one case per column, their settings."""
    cases = [{"strategy": c, "fault": "nan-grad", "cell": "detected"} for c in columns]
    return {"settings": {"train": {"steps": 5}, "world_size": 2, "fault_step": 2,
                         "replica_check_every": 2, "watchdog_s": 2.0},
            "cases": cases, "bucket_alignment": [],
            "columns": column_settings(SETTINGS, columns)}


def _headers(section: dict) -> list[str]:
    cfg = {"world_sizes": [1, 2], "bucket_cap_mb": 0.025}
    return fault_tables(section, cfg)[0].headers[1:]


def test_the_defaults_column_runs_what_harden_runs_without_a_config():
    assert SETTINGS.sync_config(DEFAULTS) == harden_defaults() == ArmConfig(name="hardened")
    assert SETTINGS.train_config(DEFAULTS, "nan-grad").sync == harden_defaults()


def test_the_full_fault_matrix_has_the_defaults_column_and_the_quick_one_does_not():
    assert DEFAULTS in faults.columns_of(CompareConfig(world_sizes=(1, 2)))
    assert DEFAULTS not in faults.columns_of(CompareConfig(world_sizes=(1, 2), quick=True))


def test_the_fault_matrix_table_marks_every_column_not_run_at_its_defaults():
    headers = _headers(_section(matrix_strategies()))
    marked = {h.removesuffix(f" {NON_DEFAULT}") for h in headers if h.endswith(NON_DEFAULT)}
    assert marked == {"hardened", "hardened-bucket", "bucketed"}
    assert DEFAULTS in headers and "ddp" in headers


def test_the_marks_come_from_the_settings_in_the_record():
    section = _section(("ddp", "hardened"))
    as_defaults = copy.deepcopy(section)
    as_defaults["columns"]["hardened"]["sync"] = as_defaults["columns"]["hardened"]["defaults"]
    assert _headers(section) == ["ddp", f"hardened {NON_DEFAULT}"]
    assert _headers(as_defaults) == ["ddp", "hardened"]


def test_a_record_without_column_settings_marks_no_column():
    section = _section(("ddp", "hardened"))
    del section["columns"]
    assert _headers(section) == ["ddp", "hardened"]
