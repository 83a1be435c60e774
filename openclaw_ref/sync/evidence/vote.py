"""The one vote every cross-rank comparison uses to name the ranks that differ, and its one
wording.

A rank is singled out only by a strict majority: when more than half of the ranks hold one
value, the ranks holding anything else are the suspects. Without a strict majority (two ranks
that disagree, 2 against 2, three distinct values …) nothing tells the faulty side from the
healthy one, so EVERY rank compared is a suspect (``Vote.tie``): two ranks that disagree name
two suspects, and the words say that either may be the faulty one — never "drain the named
node". ``reference`` is then only the lowest rank's value (a default for a figure such as the
step, not a verdict).

Checks that can attribute a split by a per-rank fact instead (a rank that loaded a checkpoint
more often, a rank with a NaN of its own, a rank whose results vary from run to run) do so in
their own module and say why; they never call a tie a majority.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Hashable, Sequence
from typing import NamedTuple


class Vote(NamedTuple):
    reference: Hashable  # the strict majority's value; on a tie the lowest rank's (no verdict)
    differing: list[int]  # the suspects (indices into the values); on a tie every index
    tie: bool = False  # no strict majority: every rank compared is a suspect


def majority(values: Sequence[Hashable]) -> Vote:
    """The vote over ``values`` (one per rank, in rank order; hashable). An empty sequence has
    no vote (``ValueError``).

    ``majority(["a", "a", "b"])`` is ``Vote("a", [2], False)``; ``majority(["a", "b"])`` is
    ``Vote("a", [0, 1], True)``: with two ranks that disagree both are suspects."""
    if not values:
        raise ValueError("no values to vote on")
    counts = Counter(values)
    top = max(counts.values())
    if len(counts) == 1:
        return Vote(values[0], [], False)
    if 2 * top > len(values):
        reference = next(v for v in values if counts[v] == top)
        return Vote(reference, [r for r, v in enumerate(values) if v != reference], False)
    return Vote(values[0], list(range(len(values))), True)


def suspects_of(off: Sequence[int], world: int) -> Vote:
    """The vote when each of ``world`` ranks is either in or off a reference (a tolerance
    around the ranks' median, say): the ``off`` ranks are suspects only if the others hold a
    strict majority; otherwise every rank is."""
    off = sorted(set(off))
    if not off:
        return Vote(True, [], False)
    if 2 * (world - len(off)) > world:
        return Vote(True, off, False)
    return Vote(True, list(range(world)), True)


TIE_WORDS = "no majority: either side may be the faulty one"


def split_view(values: Sequence[object], vote: Vote, ranks: Sequence[int] | None = None,
               show: Callable[[object], str] = str) -> str:
    """How the ranks' ``values`` split under ``vote`` (``ranks``: the rank of each value,
    default its index). With a strict majority, the value it holds and the other ranks'
    values; on a tie every rank's value and ``TIE_WORDS``."""
    ids = list(ranks) if ranks is not None else list(range(len(values)))
    if not vote.tie:
        agree = next(i for i in range(len(values)) if i not in set(vote.differing))
        others = ", ".join(f"rank {ids[i]}: {show(values[i])}" for i in vote.differing)
        return f"{show(values[agree])} on {len(values) - len(vote.differing)} of " \
               f"{len(values)} ranks, {{{others}}}"
    every = ", ".join(f"rank {ids[i]}: {show(values[i])}" for i in range(len(values)))
    return f"the ranks disagree, {TIE_WORDS}: {{{every}}}"


def tie_caveat(vote: Vote) -> str:
    """The clause a message appends on a tie ("" with a strict majority)."""
    return f"; the ranks disagree, {TIE_WORDS}" if vote.tie else ""
