"""The close-time replica check of ``harden()``'s guards: every slice, once, when the run ends.

Why. Each step digests one slice of K (``replica_slices``), so a parameter changed on one rank
after its slice was last visited would go unseen until the rotation comes back to it — forever,
if the run ends first: a run could stop with diverged replicas and exit 0. ``close()`` therefore
compares every synchronized parameter at once (``checks.replica_check``, the project's one
full replica comparison), so the detection window is: a divergence is caught within K steps
(16 by default), or at ``close()`` for the rest.

Invariant. The check is a collective: it runs only where every rank runs it — on a guard that
has finished at least one digested step, has not raised, is closed with ``verify`` left True,
and is not being closed while an exception propagates (a ``finally:`` after a failure, where a
peer may never arrive). A rank cannot know that a peer failed without a collective, so the
gather may still meet a peer that died or stopped (it failed, or left its loop early): the
backend's error comes at once for a dead peer, at the process group's timeout for one that never
arrives, and the check is then recorded as not run (a ``NOT_RUN`` event and a warning), not
raised — the close of a run whose peer already failed must not replace that failure.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Sequence
from typing import Protocol

import torch.distributed as dist
from torch import nn

from openclaw_ref.sync.errors import ConsistencyError, Event, backend_message
from openclaw_ref.sync.evidence import checks
from openclaw_ref.sync.evidence.replica_slices import ReplicaSlices
from openclaw_ref.sync.evidence.watchdog import Watchdog

NOT_RUN = "CloseCheckNotRun"  # Event kind: the close-time gather failed (a peer gone)


class ClosingGuard(Protocol):
    """What both guards (``StepGuard``, ``HardenState``) hold that the check reads."""

    closed: bool
    failed: bool
    clock: int
    group: object
    global_ranks: list[int]
    replicas: ReplicaSlices
    watchdog: Watchdog | None
    events: list[Event]


def check_due(guard: ClosingGuard, verify: bool) -> bool:
    """Would every rank run the close-time check now (module docstring's invariant)?"""
    return (verify and not guard.closed and not guard.failed and guard.replicas.enabled
            and guard.replicas.digested > 0 and sys.exc_info()[1] is None
            and dist.is_available() and dist.is_initialized())


def verify_replicas(guard: ClosingGuard) -> None:
    """Compare every synchronized parameter across the guard's ranks; raises
    ``ReplicaDivergence`` (global ranks; the differing parameters, the first first); a failed
    gather is recorded, not raised (module docstring)."""
    named: Sequence[tuple[str, nn.Parameter]] = guard.replicas.named
    step = max(guard.clock - 1, 0)  # the last step run (the clock has moved past it)
    try:
        checks.replica_check(named, step=step, group=guard.group, digest=guard.replicas.digest)
    except ConsistencyError as exc:
        err = exc.renumbered(guard.global_ranks)
        raise type(err)(f"{err.detail} at close(), after the optimizer step (every slice "
                        f"compared)", step=step, ranks=err.ranks, params=err.params) from None
    except RuntimeError as exc:
        detail = f"replica check at close() not run: {backend_message(exc)}"
        guard.events.append(Event(NOT_RUN, step, detail=detail))
        warnings.warn(f"openclaw: {detail}", RuntimeWarning, stacklevel=2)


def check_watchdog(guard: ClosingGuard) -> None:
    """Raise the watchdog's diagnosis, if it has one for this rank, marking the guard failed
    (so its ``close()`` runs no collective a dead peer would never join)."""
    if guard.watchdog is not None:
        try:
            guard.watchdog.check()
        except BaseException:
            guard.failed = True
            raise


def close_check(guard: ClosingGuard, verify: bool) -> None:
    """The check at ``close()``, where due; a failure marks the guard failed."""
    if not check_due(guard, verify):
        return
    try:
        verify_replicas(guard)
    except BaseException:
        guard.failed = True
        raise
