"""The ledger as a whole: every rule's declared outcomes are reached, sources are named, absent
evidence is honest; plus the bootstrap interval and the run record the rules read.

A rule that cannot flip is a defect: ``test_every_declared_outcome_is_exercised`` fails when a
rule declares an outcome no case reaches, or a case reaches an undeclared one. The cases live
beside each family's rules in ``test_claims_<family>.py``; the synthetic records they build are
in ``claims_records.py``.
"""

from __future__ import annotations

import json

import pytest
import test_claims_causes_and_fixes
import test_claims_lightning
import test_claims_prevention_and_results
import test_claims_symptoms
from claims_records import (
    BY_ID,
    NOISY,
    Case,
    curves,
    f2_runs,
    hardened_paired,
    record,
    repeats,
    strategies,
)

from openclaw_ref.core.metrics import bootstrap_ratio
from openclaw_ref.reporting.claims import (
    CLAIMS,
    MIN_REPEATS,
    SOURCES,
    Verdict,
    assess,
    assess_all,
)
from openclaw_ref.reporting.claims.symptoms import PER_BUCKET
from openclaw_ref.reporting.record import SCHEMA_VERSION, RecordError, load_record, parse_record
from openclaw_ref.reporting.render import claims_markdown

CASES: list[Case] = [*test_claims_symptoms.CASES, *test_claims_causes_and_fixes.CASES,
                     *test_claims_prevention_and_results.CASES, *test_claims_lightning.CASES]


def test_every_declared_outcome_is_exercised():
    reached: dict[str, set[str]] = {}
    for claim_id, _, _, expected in CASES:
        reached.setdefault(claim_id, set()).add(expected)
    for claim in CLAIMS:
        assert set(claim.outcomes) <= set(Verdict), claim.id
        assert reached.get(claim.id) == set(claim.outcomes), claim.id


def test_settings_and_interfaces_are_never_reproduced():
    for claim_id in ("S1", "S2", "P3"):
        assert Verdict.REPRODUCED not in BY_ID[claim_id].outcomes


def test_every_claim_names_its_seed_source():
    assert len({c.id for c in CLAIMS}) == len(CLAIMS) == 33
    for claim in CLAIMS:
        assert claim.text and any(claim.source.startswith(doc) for doc in SOURCES), claim.id


def test_an_empty_record_is_honest():
    """No section ran: every verdict is a label from the vocabulary; nothing is reproduced."""
    for claim, finding in assess_all(record()):
        assert finding.label in claim.outcomes, claim.id
        judged = (Verdict.REPRODUCED, Verdict.NOT_REPRODUCED, Verdict.REFUTED)
        assert finding.label not in judged, claim.id


def test_hardware_verdicts_name_the_hardware_and_a_command():
    rec = record(strategies(*repeats(PER_BUCKET, 4, [10.0] * 5, "skew")))
    found = {c.id: f for c, f in assess_all(rec)}
    assert "≥ 8 cores" in found["C3"].reason and "--backend nccl" in found["C3"].command
    assert "NCCL" in found["R5"].reason and "NCCL" in found["C6"].reason


def test_insufficient_repeats_say_how_many_and_what_to_run():
    f = assess(BY_ID["R2"], record(hardened_paired([0.5] * 3, [0.05] * 3)))
    assert "insufficient repeats: 3 < 5" in f.reason and "--repeats 5" in f.reason


def test_verdicts_are_identical_across_renders():
    rec = record({**curves(), **f2_runs([40 * x for x in NOISY], [40.0] * 5)})
    assert assess_all(rec) == assess_all(rec)


# ---------------------------------------------------------------------------------------------
# The bootstrap interval


def test_bootstrap_is_seeded_and_brackets_a_noisy_ratio():
    num, den = [1.0, 1.3, 0.9, 1.2, 1.1], [1.0] * 5
    first, again = bootstrap_ratio(num, den), bootstrap_ratio(num, den)
    assert first == again
    assert first.low <= first.point <= first.high and first.n == 5
    assert bootstrap_ratio([2.0] * 5, [1.0] * 5).low == 2.0


def test_bootstrap_rejects_unpaired_samples():
    with pytest.raises(ValueError):
        bootstrap_ratio([1.0, 2.0], [1.0])


# ---------------------------------------------------------------------------------------------
# The run record


def test_a_version_1_record_is_read_unchanged(tmp_path):
    doc = json.loads(json.dumps(record().doc))
    del doc["schema_version"]
    path = tmp_path / "cpu2-gloo" / "raw.json"
    path.parent.mkdir()
    path.write_text(json.dumps(doc))
    rec = load_record(path)
    assert rec.upgraded_from == 1 and rec.source == "cpu2-gloo"
    assert f"record schema 1, read as {SCHEMA_VERSION}" in claims_markdown(rec, "results/cpu2-gloo")


@pytest.mark.parametrize(("doc", "message"), [
    ({"schema_version": 99, "meta": {}}, "schema_version 99"),
    ({"foo": 1}, "no schema_version"),
    ([1, 2], "not a JSON object"),
])
def test_a_foreign_record_fails_with_a_clear_message(doc, message):
    with pytest.raises(RecordError, match=message) as info:
        parse_record(doc)
    assert "openclaw-bench compare" in str(info.value)


def test_a_malformed_run_is_named():
    doc = json.loads(json.dumps(record().doc))
    doc["strategies"] = {"runs": [{"variant": "ddp", "world_size": "2", "repeat": 0}]}
    with pytest.raises(RecordError, match=r"strategies.runs\[0\]"):
        parse_record(doc)


def test_the_ledger_says_where_it_was_rendered_from():
    md = claims_markdown(record(), "results/cpu2-gloo")
    assert "Rendered from `results/cpu2-gloo/raw.json`" in md
    assert "shared/" not in md and "## Sources" in md


def test_the_ledger_says_its_intervals_come_from_few_repeats():
    text = claims_markdown(record(hardened_paired([0.5] * 5, [0.05] * 5)), "results/x")
    assert f"From only {MIN_REPEATS} repeats" in text and "few distinct values" in text


def test_a_claim_with_nothing_to_regenerate_says_so_in_the_ledger():
    row = next(line for line in claims_markdown(record(), "results/x").splitlines()
               if line.startswith("| Q1 "))
    assert row.rstrip(" |").endswith("nothing to regenerate")
