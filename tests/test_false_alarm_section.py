"""The ``false_alarms`` compare section: registered, keyed in the record, its job count what its
runner ticks, and its table built from the stored figures alone (every word from the renderer).
The corpus itself runs in ``conformance/suite/test_false_alarms.py``."""

from __future__ import annotations

from openclaw_ref.experiments.false_alarms import Arm, Outcome, Pattern
from openclaw_ref.experiments.registry import SECTIONS
from openclaw_ref.experiments.sections import false_alarms
from openclaw_ref.experiments.settings import CompareConfig
from openclaw_ref.reporting.record import SECTIONS as RECORD_KEYS
from openclaw_ref.reporting.section_tables import SECTION_TABLES


def _figures() -> dict:
    rows = []
    for pattern in Pattern:
        rows.append({"world_size": 2, "pattern": pattern.value, "arm": Arm.REFERENCE.value,
                     "seconds": 1.0, "ran": True})
        for arm, outcome in ((Arm.STOCK, Outcome.NON_FINITE), (Arm.HARDENED, Outcome.EXACT)):
            error = ({"kind": "ClockMismatch", "message": "m", "ranks": [1]}
                     if arm is Arm.HARDENED and pattern is Pattern.TWO_RANKS_DISAGREE else None)
            rows.append({"world_size": 2, "pattern": pattern.value, "arm": arm.value,
                         "fault": False, "outcome": outcome.value, "seconds": 1.25,
                         "max_relative": 0.0 if arm is Arm.HARDENED else None,
                         "error": error, "events": ["WireOverflow"]})
    return {"rows": rows, "settings": {"pause_s": 2.5, "pause_deadline_s": 1.0,
                                       "pause_action": "raise", "default_deadline_s": 60.0,
                                       "overflow_at": 2, "relative_limit": 1e-6,
                                       "fp16_relative_limit": 2.0 ** -11}}


def test_the_section_is_registered_and_keyed_in_the_record():
    assert "false_alarms" in SECTIONS and "false_alarms" in RECORD_KEYS
    assert "false_alarms" in SECTION_TABLES


def test_the_job_count_is_patterns_times_arms_per_world_size():
    cfg = CompareConfig(world_sizes=(1, 2, 4, 8))
    assert false_alarms.world_sizes(cfg) == [2, 4]
    assert false_alarms.jobs(cfg) == 2 * len(Pattern) * len(Arm)
    assert false_alarms.world_sizes(CompareConfig(world_sizes=(1,))) == [2]


def test_the_table_has_one_row_per_pattern_with_both_arms_outcomes():
    _, build = SECTION_TABLES["false_alarms"]
    (table,) = build(_figures(), {})
    assert [r[0] for r in table.rows] == [p.value for p in Pattern]
    assert table.headers[1:3] == ["stock DDP", "hardened"]
    assert all(r[1] == "non-finite weights" for r in table.rows)
    assert table.rows[-1][2] == "exact (ClockMismatch ranks [1])"
    assert "bitwise" in table.caption and "2.5 s" in table.caption
    assert "default 60 s" in table.caption and "default action, raise" in table.caption
    assert all(r[3] == "0.0e+00" for r in table.rows)
