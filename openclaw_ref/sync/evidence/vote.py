"""The one vote every cross-rank comparison uses to name the ranks that differ.

A plurality, not a majority: the reference is the value the most ranks hold, and a tie goes to
the value the lowest rank holds — so with no value held by more than half of the ranks (two
ranks that disagree, three distinct values …) the lowest rank's value is still the reference
and the others are reported as differing. Callers therefore name "the ranks that differ from
the reference", never "the faulty minority"; with two ranks either could be the faulty one.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Sequence
from typing import NamedTuple


class Vote(NamedTuple):
    reference: Hashable  # the most frequent value; ties: the lowest rank's among them
    differing: list[int]  # the ranks (indices into the values) whose value is not it


def plurality(values: Sequence[Hashable]) -> Vote:
    """The reference value of ``values`` (one per rank, in rank order) and the ranks that hold
    another value. Values must be hashable; an empty sequence has no vote (``ValueError``).

    Ties are not majorities: ``plurality(["a", "b"])`` is ``Vote("a", [1])`` — rank 0's value
    is the reference only because it is the lowest rank's (see the module docstring)."""
    counts = Counter(values)
    top = max(counts.values())
    reference = next(v for v in values if counts[v] == top)
    return Vote(reference, [r for r, v in enumerate(values) if v != reference])
