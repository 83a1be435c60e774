"""How a failed fault case names its rank (``fault_matrix._from_failure``): the rank the launcher
blamed, unless that rank reported only that its peer vanished — then the ranks that exited
first. A silent death the launcher blamed is the dead rank itself, even when a sibling's echo
quoted in its summary says "by peer" and that sibling then exited on its own."""

from __future__ import annotations

from openclaw_ref.conformance.fault_matrix import CaseOutcome, _from_failure
from openclaw_ref.core.errors import RankFailed

ECHO = "RuntimeError: [gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:1"


def _outcome(failure: RankFailed, died: list[int]) -> CaseOutcome:
    out = CaseOutcome("ddp", "crash", "")
    assert _from_failure(out, failure, died) is None
    return out


def test_a_blamed_silent_death_names_the_dead_rank_though_the_echo_says_by_peer():
    death = RankFailed(1, f"exited with code 13 (then rank 0 reported: {ECHO})")
    out = _outcome(death, died=[0, 1])  # rank 0 left on its own after reporting
    assert (out.outcome, out.ranks) == ("crash", [1]) and out.kind != "peer died"


def test_a_blamed_reporter_that_only_saw_its_peer_vanish_names_the_ranks_gone_first():
    reporter = RankFailed(0, ECHO, traceback_text="Traceback (most recent call last): ...")
    out = _outcome(reporter, died=[0, 1])
    assert (out.kind, out.ranks) == ("peer died", [1])
