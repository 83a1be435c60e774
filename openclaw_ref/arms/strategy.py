"""The one small interface every benchmark arm implements (``SyncStrategy``).

A strategy turns a built model into the module the training loop calls, and owns everything
between ``loss.backward()`` and ``optimizer.step()``. The training loop knows nothing else about
it, so stock DDP, ``harden()`` and the bucketed engine are compared on identical loops.
"""

from __future__ import annotations

import abc
from typing import Protocol

from torch import nn

from openclaw_ref.arms.config import ArmConfig
from openclaw_ref.sync.base import RankInfo
from openclaw_ref.sync.errors import Event


class PreScale(Protocol):
    """A strategy's FP16 pre-scale as the fault injector drives it. ``sync.evidence.precision``'s
    ``ScalePolicy`` is the one implementation; this names only what is called on it."""

    def override(self, rank: int, exponent: int) -> None:
        """``rank`` pre-scales by 2^``exponent`` instead of the shared exponent."""


class SyncStrategy(abc.ABC):
    """Lifecycle per run: ``wrap`` once, then per step ``begin_step`` → forward/backward →
    ``finish_step`` (→ optimizer step only if it returned True); ``close`` at the end.

    Invariant every implementation keeps: after ``finish_step`` returns, every rank holds the
    same averaged gradients, or every rank got False (skip the step together), or it raised.
    """

    name: str = "?"

    def __init__(self, cfg: ArmConfig) -> None:
        self.cfg = cfg
        self.events: list[Event] = []

    @abc.abstractmethod
    def wrap(self, model: nn.Module, ctx: RankInfo) -> nn.Module:
        """Return the module to run forward on (DDP wrapper, or the model itself)."""

    def begin_step(self, step: int) -> None:
        """Called before the forward of ``step``."""

    def finish_step(self, step: int) -> bool:
        """Complete synchronization; False means every rank skips this optimizer step."""
        return True

    def step_metrics(self) -> dict:
        """Figures of the last step for the run JSON (sync ms, skew, overflow, checks …)."""
        return {}

    def summary(self) -> dict:
        return {}

    def scale_policy(self) -> PreScale | None:
        """The wire's pre-scale policy once wrapped, for strategies that pre-scale their
        gradients (the fault injector overrides one rank's exponent through it); else None."""
        return None

    def declare_failed(self, exc: BaseException, leaving: bool = False) -> None:
        """This rank stops with ``exc``: tell the peers, so that none outlives the failed job
        (``hardened``: the watchdog's failure note, ``sync/evidence/job_end.py``); ``leaving``:
        the process ends next, so wait (bounded) until they read it. Never raises."""

    def known_failure(self) -> BaseException | None:
        """The failure this rank knows ended the job (``hardened``: its own, once declared,
        else the failure note its watchdog read), or None: what this rank says if it is ended
        from outside before it ends itself. Never raises."""
        return None

    def close(self, verify: bool = True) -> None:
        """Release hooks and threads. ``verify``: the run ended cleanly on every rank, so a
        strategy may run a last collective check (``hardened``: every replica slice); with
        ``verify=False`` (a failed run) it must not block on other ranks."""
