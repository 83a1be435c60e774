"""The one small interface every gradient-synchronization strategy implements.

A strategy turns a built model into the module the training loop calls, and owns everything
between ``loss.backward()`` and ``optimizer.step()``. The training loop knows nothing else about
it, so stock DDP, the hardened hook and the bucketed engine are compared on identical loops.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import torch
import torch.distributed as dist
from torch import nn

from openclaw_ref.sync.errors import BadInput, Event

if TYPE_CHECKING:
    from openclaw_ref.sync.precision import ScalePolicy

WIRES = ("native", "fp32", "fp16", "bf16")
NONFINITE_POLICIES = ("skip", "raise")


class RankInfo(Protocol):
    """What a strategy needs to know about the rank it runs on. The launcher's ``RankContext``
    implements it; so can any user's object (the hook library never imports the launcher)."""

    rank: int
    world_size: int
    backend: str
    device: torch.device
    store: dist.Store  # heartbeats of the watchdog

    def report_fatal(self, exc: BaseException) -> None:
        """Report ``exc`` as this rank's failure from any thread and end the process."""
PLANNERS = ("static", "norm-ema", "norm-ema-agreed")


@dataclass(frozen=True)
class SyncConfig:
    """Every knob of every strategy; each strategy validates the ones it reads."""

    name: str = "ddp"
    wire: str = "native"  # the gradients' own dtype; fp32/fp16/bf16 cast every bucket
    scale: str = "4096"  # a power of two, or "auto" (dynamic, identical on every rank)
    planner: str = "static"
    bucket_cap_mb: float = 25.0  # torch DDP's default
    replica_check_every: int = 0  # steps between parameter-digest comparisons; 0 = off
    watchdog_s: float = 60.0  # a bucket's allreduce older than this names the late ranks
    # A rank's local NaN/inf gradient: "skip" the step on every rank together (what a loss
    # scaler such as torch.amp.GradScaler expects) or "raise" NonFiniteGradient (no scaler).
    nonfinite: str = "skip"
    # Keyword arguments for DistributedDataParallel (find_unused_parameters, static_graph,
    # gradient_as_bucket_view, ...) over the suite's defaults; bucket_cap_mb is the field above.
    ddp_options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.wire not in WIRES:
            raise BadInput(f"--wire must be one of {', '.join(WIRES)}; got {self.wire!r}")
        if self.nonfinite not in NONFINITE_POLICIES:
            raise BadInput(f"--nonfinite must be one of {', '.join(NONFINITE_POLICIES)}; "
                           f"got {self.nonfinite!r}")
        if self.planner not in PLANNERS:
            raise BadInput(f"--planner must be one of {', '.join(PLANNERS)}; got {self.planner!r}")
        if self.scale != "auto":
            try:
                value = int(self.scale)
            except ValueError:
                value = 0
            if value < 1 or value & (value - 1):
                raise BadInput(f"--scale must be a power of two or 'auto'; got {self.scale!r}")
        if self.bucket_cap_mb <= 0:
            raise BadInput(f"bucket cap must be positive; got {self.bucket_cap_mb}")
        if self.replica_check_every < 0:
            raise BadInput("replica check interval must be >= 0 (0 = off)")
        if self.watchdog_s <= 0:
            raise BadInput("watchdog deadline must be positive")


class SyncStrategy(abc.ABC):
    """Lifecycle per run: ``wrap`` once, then per step ``begin_step`` → forward/backward →
    ``finish_step`` (→ optimizer step only if it returned True); ``close`` at the end.

    Invariant every implementation keeps: after ``finish_step`` returns, every rank holds the
    same averaged gradients, or every rank got False (skip the step together), or it raised.
    """

    name: str = "?"

    def __init__(self, cfg: SyncConfig) -> None:
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

    def scale_policy(self) -> ScalePolicy | None:
        """The wire's pre-scale policy once wrapped, for strategies that pre-scale their
        gradients (the fault injector overrides one rank's exponent through it); else None."""
        return None

    def close(self) -> None:
        """Release hooks and threads; must not block on other ranks."""
