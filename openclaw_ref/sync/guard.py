"""``GuardBase``: what every guard ``harden()`` returns shares — the DDP step guard
(``ddp/step_guard.py``), the per-bucket guard's state (``ddp/harden_state.py``) and the FSDP2
guard (``fsdp/guard.py``). One lifecycle: the group and the ranks it names, the events, the
integer clock every rank must agree on, the hang watchdog, how a failed collective is reported,
and ``close()``: the close-time replica check, then the teardown. A guard specialises by
overriding (``_verify_replicas``, ``_release``), never by copying the close path.

The close-time replica check. Each step digests one slice of K (``replica_slices``), so a
parameter changed on one rank after its slice was last visited would go unseen until the
rotation comes back to it — forever, if the run ends first: a run could stop with diverged
replicas and exit 0. ``close()`` therefore compares every synchronized parameter once more
(DDP: ``checks.replica_check``; FSDP2: ``fsdp/close.py`` over the whole mesh), so a divergence
is caught within K steps (16 by default), or at ``close()`` for the rest.

Invariant. That check is a collective: it runs only where every rank runs it — on a guard that
has finished at least one digested step, has not raised, is closed with ``verify`` left True,
and is not being closed while an exception propagates (a ``finally:`` after a failure, where a
peer may never arrive). A rank cannot know that a peer failed without a collective, so the
gather may still meet a peer that died or stopped: the backend's error comes at once for a dead
peer, at the process group's timeout for one that never arrives, and the check is then
recorded as not run (a ``NOT_RUN`` event and a warning), not raised — the close of a run whose
peer already failed must not replace that failure.
"""

from __future__ import annotations

import abc
import sys
import warnings
from typing import NoReturn

import torch.distributed as dist
from torch import nn

from openclaw_ref.sync.attached import Unset, keep_off_pickles
from openclaw_ref.sync.base import RankInfo, SyncConfig
from openclaw_ref.sync.errors import (
    CollectiveFailed,
    ConsistencyError,
    Event,
    backend_message,
)
from openclaw_ref.sync.evidence import checks
from openclaw_ref.sync.evidence.heartbeat import namespace_for
from openclaw_ref.sync.evidence.job_end import exit_fatal
from openclaw_ref.sync.evidence.replica_slices import ReplicaSlices
from openclaw_ref.sync.evidence.watchdog import Watchdog
from openclaw_ref.sync.target import HARDENED_MARK

NOT_RUN = "CloseCheckNotRun"  # Event kind: the close-time gather failed (a peer gone)


class GuardBase(abc.ABC):
    """The shared lifecycle (module docstring). A subclass sets ``module`` (what a canary
    probes), ``tracked`` (the parameters whose gradients it checks) and ``replicas`` (what the
    step digests, slice by slice), and advances ``clock`` once per step it judges."""

    module: nn.Module | None = None
    tracked: list[tuple[str, nn.Parameter]]
    replicas: ReplicaSlices

    def __init__(self, cfg: SyncConfig, group: dist.ProcessGroup) -> None:
        self.cfg = cfg
        self.group = group
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)
        self.global_ranks = dist.get_process_group_ranks(group)
        self.events: list[Event] = []  # what was found, raised or not (errors.Event)
        self.clock = 0  # the step every rank must agree on
        self.watchdog: Watchdog | None = None
        self.handles: list = []  # what harden() registered (``.remove()``), for close()
        self.closed = False
        self.failed = False  # the guard raised: no close-time check (module docstring)
        self.canary = None  # the compute canary (``canary.schedule``), where it runs
        self.canary_off = ""  # why there is none (``hardening.canary_interval``)

    def mark(self, model: nn.Module, *also: nn.Module) -> None:
        """``model`` is guarded by this guard until ``close()`` (``target.HARDENED_MARK``: a
        second ``harden()`` of it is refused). Called once everything is registered: from
        then on nothing the guard attached to ``model``'s modules or to ``also``'s (the module
        a ``replicate()`` guard hooks) travels with a pickle or a copy (``attached.py``)."""
        setattr(model, HARDENED_MARK, self)
        self.handles.append(Unset(model, HARDENED_MARK))
        keep_off_pickles([model, *also], self.handles)

    # -- the watchdog and failures ------------------------------------------------------------
    def watch(self, ctx: RankInfo | None) -> None:
        """Start the hang watchdog on ``ctx``'s store (the default store without one), which
        reports a fatal diagnosis through ``ctx.report_fatal`` (``os._exit`` without one)."""
        store = ctx.store if ctx is not None else dist.distributed_c10d._get_default_store()
        report = ctx.report_fatal if ctx is not None else exit_fatal
        namespace = namespace_for(store, self.global_ranks[self.rank],
                                  group_ranks=self.global_ranks)
        self.watchdog = Watchdog(store, self.rank, self.world_size, self.cfg.watchdog_s,
                                 namespace, on_timeout=report, global_ranks=self.global_ranks,
                                 action=self.cfg.watchdog_action, events=self.events)

    def _check_watchdog(self) -> None:
        """Raise the watchdog's diagnosis, if it has one for this rank, marking the guard failed
        (so its ``close()`` runs no collective a dead peer would never join)."""
        if self.watchdog is not None:
            try:
                self.watchdog.check()
            except BaseException:
                self.failed = True
                raise

    def _failed(self, exc: BaseException) -> None:
        """The guard's step failed with ``exc``: no close-time check from now on, and the
        watchdog's diagnosis raised instead, where it has one for this failure."""
        self.failed = True
        if self.watchdog is not None:
            self.watchdog.check(exc)

    def _collective_failed(self, exc: BaseException, step: int, *,
                           cause: BaseException | None = None,
                           bucket: int | None = None) -> NoReturn:
        """A collective of this guard failed (``cause``: the bucket's own error, where known):
        ``CollectiveFailed`` with the backend's words, unless the watchdog explains it."""
        self._failed(exc)
        raise CollectiveFailed(backend_message(cause or exc), step=step, bucket=bucket) from exc

    def declare_failed(self, exc: BaseException, leaving: bool = False) -> None:
        """This rank stops with ``exc``: tell the peers through the watchdog's failure note
        (``evidence/job_end.py``); ``leaving``: wait, bounded, until they read it."""
        if self.watchdog is not None:
            self.watchdog.declare_failed(exc, leaving)

    def known_failure(self) -> BaseException | None:
        """The failure this rank knows ended the job (its own, once declared, else a peer's
        note its watchdog read), or None."""
        return None if self.watchdog is None else self.watchdog.known_failure()

    # -- close: the template ------------------------------------------------------------------
    def close(self, verify: bool = True) -> None:
        """Compare every replica once more where every rank does (module docstring: a
        collective, skipped after a failure, while an exception propagates or with
        ``verify=False``), then remove what ``harden()`` added and stop the watchdog, also when
        the check raises; idempotent."""
        try:
            if self._close_check_due(verify):
                self._close_check()
        finally:
            self._teardown()

    def _close_check(self) -> None:
        """The check itself: a failed gather (a peer gone) recorded, anything else raised
        (and the guard failed)."""
        try:
            self._verify_replicas()
        except RuntimeError as exc:
            detail = f"replica check at close() not run: {backend_message(exc)}"
            self.events.append(Event(NOT_RUN, self.last_step, detail=detail))
            warnings.warn(f"openclaw: {detail}", RuntimeWarning, stacklevel=3)
        except BaseException:
            self.failed = True
            raise

    def _close_check_due(self, verify: bool) -> bool:
        """Would every rank run the close-time check now (module docstring's invariant)?"""
        return (verify and not self.closed and not self.failed and self.replicas.enabled
                and self.replicas.digested > 0 and sys.exc_info()[1] is None
                and dist.is_available() and dist.is_initialized())

    @property
    def last_step(self) -> int:
        """The last step run: the clock has moved past it."""
        return max(self.clock - 1, 0)

    def _verify_replicas(self) -> None:
        """Every synchronized parameter compared across the group; ``ReplicaDivergence``
        naming global ranks and the differing parameters, the first first (a failed gather:
        its ``RuntimeError``)."""
        step = self.last_step
        try:
            checks.replica_check(self.replicas.named, step=step, group=self.group,
                                 digest=self.replicas.digest)
        except ConsistencyError as exc:
            err = exc.renumbered(self.global_ranks)
            raise type(err)(f"{err.detail} at close(), after the optimizer step (every slice "
                            f"compared)", step=step, ranks=err.ranks, params=err.params) from None

    def _teardown(self) -> None:
        self.closed = True
        self._release()
        for handle in self.handles:
            handle.remove()
        self.handles.clear()
        if self.watchdog is not None:
            self.watchdog.close()

    def _release(self) -> None:
        """What the guard drops at close beyond its hooks and watchdog (a subclass's state)."""

    def joining(self) -> bool:
        """Is this rank inside ``Join``, where a joined rank runs no collective of every rank
        outside the wrapper's own? (DDP's ``Join([ddp])``; never elsewhere.)"""
        return False

    # -- the user's entry points --------------------------------------------------------------
    @abc.abstractmethod
    def begin_step(self, step: int) -> None:
        """Optional for the user: names the step every rank must agree on."""

    @abc.abstractmethod
    def finish_step(self, step: int | None = None) -> bool:
        """Optional for the user: the step's verdict; False: every rank skips this step."""

    @abc.abstractmethod
    def step_metrics(self) -> dict:
        """The last settled step's figures."""

    @abc.abstractmethod
    def summary(self) -> dict:
        """The run's counts and settings."""

    @abc.abstractmethod
    def held_bytes(self) -> int:
        """Bytes the guard holds between steps."""
