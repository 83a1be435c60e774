"""Which rank caused a failed task: decided from what the parent saw of each rank, never from
pipe readiness.

The parent of a ``RankPool`` observes three kinds of evidence per rank during one task: the rank
finished (sent its result), the rank reported an error (sent its traceback), and the rank's
process exited (its exit status, from the process sentinel). Arrival order is a race: when rank 0
is killed by SIGABRT inside gloo, rank 1's "Connection closed by peer" often reaches the parent
before rank 0's exit does, and sometimes after. ``FailureTriage`` gives the same verdict for every
order, because each rule reads facts that stay true once observed:

1. A rank whose process exited before it finished and without reporting an error is a *silent
   death* — killed by a signal, or ``os._exit`` without last words. It is the root cause whenever
   it is seen, before or after a sibling's error: a sibling's transport error is a consequence.
   Among several, a signal death beats an exit code, then the lowest rank.
2. A consistency check (exit code 3) fires on every rank at once: wait (bounded) until every
   unfinished rank has reported or exited, so rank 0 writes its run record before the siblings
   are killed, then blame the first reporter.
3. Any other ``OpenClawError`` (a watchdog's ``SyncTimeout``, bad input) names its own cause:
   blame the reporter at once — except ``JobFailed`` (a rank ending because its peer failed),
   an echo: blamed only when no other rank's report comes (rule 4).
4. Any other exception may be the echo of a sibling's silent death: wait (bounded) for the
   unfinished siblings to report or exit; blame a silent death if one shows up, else the first
   reporter.

``now`` is passed in, never read, so tests drive every order of arrival without sleeping.
"""

from __future__ import annotations

import signal
from collections.abc import Iterable
from dataclasses import dataclass, field

from openclaw_ref.sync.errors import EXIT_CHECK_FIRED, JobFailed, OpenClawError

CHECK_GRACE_S = 5.0  # rule 2: time for the siblings' last words (rank 0 writes the run JSON)
ECHO_GRACE_S = 2.0  # rule 4: time for a silently dead sibling's exit to be seen


def describe_exit(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        return f"killed by signal {signal.Signals(-code).name}"
    return f"exited with code {code}"


@dataclass(frozen=True)
class Report:
    """An error a rank sent before leaving; also the verdict ``decide`` returns (for a silent
    death: the rank, how it ended, no traceback)."""

    rank: int
    summary: str
    traceback_text: str = ""
    cause: BaseException | None = None

    @property
    def is_check(self) -> bool:
        return getattr(self.cause, "exit_code", None) == EXIT_CHECK_FIRED

    @property
    def names_its_cause(self) -> bool:
        return isinstance(self.cause, OpenClawError) and not self.is_echo

    @property
    def is_echo(self) -> bool:
        """A rank ending because a peer failed (``JobFailed``): never the cause while the
        peer's own report is known."""
        return isinstance(self.cause, JobFailed)


@dataclass
class FailureTriage:
    """Evidence of one task on ranks ``ranks``; ``decide(now)`` returns the ``Report`` to blame
    once the rules above can name a rank, else None (keep waiting, at most until
    ``wake_at()``)."""

    ranks: Iterable[int]
    finished: set[int] = field(default_factory=set)
    reports: list[Report] = field(default_factory=list)
    exits: dict[int, int] = field(default_factory=dict)
    _first_report_at: float | None = None

    def __post_init__(self) -> None:
        self.ranks = tuple(self.ranks)

    # evidence ---------------------------------------------------------------------------
    def finish(self, rank: int) -> None:
        self.finished.add(rank)

    def report(self, report: Report, now: float) -> None:
        if self._first_report_at is None:
            self._first_report_at = now
        self.reports.append(report)

    def exited(self, rank: int, exitcode: int | None) -> None:
        """The rank's process is gone (its sentinel fired); ``exitcode`` as multiprocessing
        gives it (negative: the signal)."""
        self.exits[rank] = exitcode if exitcode is not None else 1

    # verdict ----------------------------------------------------------------------------
    def silent_deaths(self) -> list[int]:
        reported = {r.rank for r in self.reports}
        dead = [r for r in self.exits if r not in self.finished and r not in reported]
        return sorted(dead, key=lambda r: (self.exits[r] >= 0, r))

    def settled(self) -> bool:
        """Every unfinished rank has reported or exited: no further evidence is coming."""
        reported = {r.rank for r in self.reports}
        return all(r in self.finished or r in reported or r in self.exits for r in self.ranks)

    def wake_at(self) -> float | None:
        """When ``decide`` turns without new evidence (the end of the grace), if ever."""
        if not self.reports or self._first_report_at is None:
            return None
        grace = CHECK_GRACE_S if self.reports[0].is_check else ECHO_GRACE_S
        return self._first_report_at + grace

    def decide(self, now: float) -> Report | None:
        dead = self.silent_deaths()
        if dead:
            return self._blame_death(dead[0])
        if not self.reports:
            return None
        first = next((r for r in self.reports if not r.is_echo), self.reports[0])
        if first.names_its_cause and not first.is_check:
            return first
        wake = self.wake_at()
        if self.settled() or (wake is not None and now >= wake):
            return first
        return None

    def _blame_death(self, rank: int) -> Report:
        summary = describe_exit(self.exits[rank])
        if self.reports:
            echo = self.reports[0]
            summary += f" (then rank {echo.rank} reported: {echo.summary[:160]})"
        return Report(rank, summary)

