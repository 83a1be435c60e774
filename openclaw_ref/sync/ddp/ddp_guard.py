"""``DDPGuard``: what the two DDP guards — the step guard (``step_guard.py``) and the per-bucket
guard's state (``harden_state.py``) — share beyond ``GuardBase``: the wire's scale policy, the
ledger that judges every step (``evidence/ledger.py``), the replica slices a step digests,
where a step's verdict is read (``SyncConfig.verdict_at``), and the step protocol a user may
call (``begin_step``/``finish_step``, and the optimizer step's pre-hook ``harden()``
registers). Each guard says how a pending step is judged (``_settle``) and where its
ready-time clock starts (``_start_clock``).

Two ways to use a DDP guard, the same checks in both::

    ddp = DistributedDataParallel(model)
    state = harden(ddp)                       # 1. no protocol: train as usual
    for batch in loader:
        loss_fn(ddp(batch)).backward()        #    raises on any disagreement
        opt.step(); opt.zero_grad()

    for step, batch in enumerate(loader):     # 2. explicit: name the step, learn the verdict
        state.begin_step(step)
        loss_fn(ddp(batch)).backward()
        if state.finish_step(step):           #    False: every rank skips this step
            opt.step()
        opt.zero_grad()
"""

from __future__ import annotations

import abc
import time

import torch.distributed as dist
from torch import nn

from openclaw_ref.sync.base import NonFinitePolicy, SyncConfig, VerdictAt
from openclaw_ref.sync.canary.row import canary_summary
from openclaw_ref.sync.evidence.ledger import Ledger
from openclaw_ref.sync.evidence.precision import ScalePolicy
from openclaw_ref.sync.evidence.replica_slices import ReplicaSlices
from openclaw_ref.sync.guard import GuardBase


class DDPGuard(GuardBase):
    """The shared part of the DDP guards (module docstring). ``named``: the model's parameters
    (whose gradients a wire-only overflow drops); ``synchronized``: those DDP keeps equal,
    which the replica slices compare (not those DDP was told to ignore)."""

    def __init__(self, cfg: SyncConfig, group: dist.ProcessGroup,
                 named: list[tuple[str, nn.Parameter]],
                 synchronized: list[tuple[str, nn.Parameter]]) -> None:
        super().__init__(cfg, group)
        self.policy = ScalePolicy.from_config(cfg)
        self.synchronized = synchronized
        self.replicas = ReplicaSlices(synchronized, cfg.replica_slices)
        self.ledger = Ledger(self.world_size, self.policy, rank=self.rank,
                             global_ranks=self.global_ranks,
                             raise_nonfinite=cfg.nonfinite is NonFinitePolicy.RAISE,
                             params=[p for _, p in named], events=self.events)
        # CUDA only: ready times from events on the current stream (host clocks there measure
        # kernel launches, not when the gradients were ready); read after the step's host sync
        self.on_cuda = any(p.is_cuda for _, p in named)
        self.deferred = (cfg.verdict_at is VerdictAt.OPTIMIZER_STEP
                         or (cfg.verdict_at is VerdictAt.AUTO and self.on_cuda))
        self.step_t0 = time.perf_counter()
        self._verdict: bool | None = None  # of the last settled step, until finish_step reads it
        self._opened = False  # the DDP object's forward pre-hook opened this forward's step

    @abc.abstractmethod
    def _settle(self) -> None:
        """Judge the step whose verdict is pending; nothing when none is."""

    @abc.abstractmethod
    def _start_clock(self) -> None:
        """The ready-time origin of the next step."""

    def _enter(self) -> None:
        """Where the user's code enters the guard: the watchdog's diagnosis, then a pending
        step's verdict, each raised here if it is an error."""
        self._check_watchdog()
        self._settle()

    def open_forward(self) -> None:
        """A forward begins (the DDP object's forward pre-hook, ``ddp(x)``): the watchdog's
        diagnosis and a pending verdict raised, before DDP's own pre-forward (its buffer
        broadcast, its check that the last reduction finished); the ready-time origin."""
        self._enter()
        self._start_clock()
        self._opened = True

    def open_module_forward(self) -> None:
        """The module DDP runs begins a forward (its pre-hook): the step opened here where no
        pre-hook of the DDP object opened it — ``ddp.forward(x)`` skips the DDP object's
        ``__call__``, ``replicate()`` has no DDP object, a forward may bypass DDP."""
        if not self._opened:
            self._enter()
            self._start_clock()
        self._opened = False

    def before_optimizer_step(self, optimizer, args, kwargs) -> None:
        """Optimizer step pre-hook (``harden()`` registers it for every optimizer): a step
        whose verdict was deferred is judged first, so an error is raised before the optimizer
        applies anything; then a wire overflow that no loss scaler skipped has its gradients
        dropped (``Ledger`` step 5)."""
        self._settle()
        self.ledger.drop_pending()

    def begin_step(self, step: int) -> None:
        """Name the step (the clock every rank must agree on). A caller of this protocol reads
        each step's verdict from ``finish_step``, so a wire overflow's gradients are no longer
        dropped for it (``Ledger`` step 5)."""
        self._enter()
        self.ledger.protocol_used()
        self.clock = step
        self._verdict = None
        self._start_clock()

    def finish_step(self, step: int | None = None) -> bool:
        """The verdict of the step the last backward settled: False = every rank skips this
        optimizer step (a non-finite sum). True when no bucket was reduced (``no_sync``)."""
        self._enter()
        verdict, self._verdict = self._verdict, None
        return True if verdict is None else verdict

    def step_metrics(self) -> dict:
        return dict(self.ledger.last)

    def _summary(self, **extra: object) -> dict:
        """The run's summary: the ledger's counts, the wire and policies, ``extra``, the
        canary."""
        return {**self.ledger.summary(), "wire": self.cfg.wire.value,
                "nonfinite": self.cfg.nonfinite.value, "scale_mode": self.cfg.scale_mode.value,
                **extra, "canary": canary_summary(self.canary, self.canary_off)}
