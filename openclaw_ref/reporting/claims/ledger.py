"""The ledger: every family's claims in the order claims.md lists them, and their findings.

The order is text 000's: setting, symptoms, causes, fixes, prevention, results, questions,
then text 004. Within a family, claims follow the order their rules are written.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from openclaw_ref.reporting.claims import (
    fixes,
    lightning,
    mechanisms,
    prevention,
    questions,
    results,
    setting,
    symptoms,
)
from openclaw_ref.reporting.claims.registry import Claim, Finding, assess
from openclaw_ref.reporting.record import RunRecord, as_record

FAMILIES = (setting, symptoms, mechanisms, fixes, prevention, results, questions, lightning)
CLAIMS: tuple[Claim, ...] = tuple(c for family in FAMILIES for c in family.FAMILY.claims)


def assess_all(rec: RunRecord | Mapping[str, Any]) -> list[tuple[Claim, Finding]]:
    """Every claim's finding, in ledger order; a raw document is validated first."""
    rec = as_record(rec)
    return [(claim, assess(claim, rec)) for claim in CLAIMS]
