"""Collectives the watchdog watches for another library beside its own exchange: FSDP2's
reduce-scatters and all-gathers, which the FSDP2 guard runs through its wrappers
(``fsdp/hooks.py``).

They carry no (step, bucket) of ours: FSDP2 issues them in its own order, and a rank that skips
its reduce-scatters (gradient sync off) issues other collectives than its peers, so progress
cannot be compared across ranks. What names the rank at fault is the evidence its guard holds
(the notes of ``fsdp/last_words.py``): once one of these collectives has waited ``deadline_s``
— gloo waits its 30-minute default on a mesh subgroup, whatever ``init_process_group`` was
given — the watchdog asks the guard's ``diagnose``: an error naming the ranks, which ends the
job (``watchdog.py``), or None (a slow collective: nothing is done; it is asked again each
tick). Registering costs a dict entry under an uncontended lock per collective.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from itertools import count

Diagnose = Callable[[], BaseException | None]


class OutsideWork:
    """The watched collectives in flight: ``add`` before waiting, the returned callable after."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._works: dict[int, tuple[float, object, Diagnose]] = {}
        self._tokens = count()

    def add(self, work, diagnose: Diagnose) -> Callable[[], None]:
        """Watch ``work`` (anything with ``is_completed()``); the callable forgets it."""
        token = next(self._tokens)
        with self._lock:
            self._works[token] = (time.monotonic(), work, diagnose)

        def done() -> None:
            with self._lock:
                self._works.pop(token, None)
        return done

    def overdue(self, deadline_s: float, now: float) -> BaseException | None:
        """The diagnosis of the first collective waiting longer than ``deadline_s`` that has
        one, else None."""
        with self._lock:
            waiting = [(since, work, diagnose) for since, work, diagnose in self._works.values()
                       if now - since > deadline_s]
        for _, work, diagnose in sorted(waiting, key=lambda w: w[0]):
            if not work.is_completed():
                error = diagnose()
                if error is not None:
                    return error
        return None
