"""``hardened``: the arm for ``--sync hardened``: stock DDP (same buckets, same collectives) with
``harden()``'s guard, as a user gets it: ``harden(ddp, cfg.harden, ctx)``."""

from __future__ import annotations

from torch import nn

from openclaw_ref.arms.ddp import wrap_ddp
from openclaw_ref.arms.strategy import SyncStrategy
from openclaw_ref.sync.base import Guard, RankInfo
from openclaw_ref.sync.evidence.precision import ScalePolicy
from openclaw_ref.sync.hardening import harden


class Hardened(SyncStrategy):
    """``hardened``: DDP (same buckets, same collectives) + ``harden``."""

    name = "hardened"

    def wrap(self, model: nn.Module, ctx: RankInfo) -> nn.Module:
        self.ddp = wrap_ddp(model, ctx, self.cfg)
        self.state = harden(self.ddp, self.cfg.harden, ctx)
        self.events = self.state.events
        return self.ddp

    def begin_step(self, step: int) -> None:
        self.state.begin_step(step)

    def finish_step(self, step: int) -> bool:
        return self.state.finish_step(step)

    def step_metrics(self) -> dict:
        return self.state.step_metrics()

    def bucket_layout(self) -> list[tuple[int, list[str]]]:
        """(bucket index, member names) of the last verified step, as this rank saw them."""
        return self.state.last_layout

    def summary(self) -> dict:
        return self.state.summary()

    def scale_policy(self) -> ScalePolicy | None:
        """The pre-scale policy of the per-bucket guard (the fault injector's handle on one
        rank's exponent); None under the step guard, which never pre-scales."""
        if not hasattr(self, "state") or self.cfg.harden.guard is Guard.STEP:
            return None
        return self.state.policy

    def declare_failed(self, exc: BaseException, leaving: bool = False) -> None:
        if hasattr(self, "state"):
            self.state.declare_failed(exc, leaving)

    def known_failure(self) -> BaseException | None:
        return self.state.known_failure() if hasattr(self, "state") else None

    def close(self, verify: bool = True) -> None:
        """Every replica slice compared once (the guard's close-time check), then closed."""
        if hasattr(self, "state"):
            self.state.close(verify)

