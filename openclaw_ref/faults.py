"""Fault injectors: reproduce each failure mode of the seed on demand, on a named rank and step.

CLI syntax: ``--inject NAME[=VALUE][@RANK][:STEP]`` (repeatable). The training loop calls the
injector at fixed points; a fault acts only on its rank, from its step on (or at that step, for
one-shot faults). Defaults: rank = the last rank, step = 2.

Hook points, in the order the training loop calls them:
  ``on_model_built(model)``   before the model is wrapped for synchronization
  ``sync_config(cfg)``        may change this rank's SyncConfig
  ``before_forward(step, model)``
  ``before_backward(step)``
  ``after_step(step, model)`` after the optimizer step
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from torch import nn

from openclaw_ref.errors import BadInput
from openclaw_ref.sync.base import SyncConfig

FAULTS: tuple[str, ...] = ()  # the names the injector implements; filled in as they land

_SPEC = re.compile(r"^(?P<name>[a-z0-9-]+)(=(?P<value>[^@:]+))?(@(?P<rank>\d+))?(:(?P<step>\d+))?$")


@dataclass(frozen=True)
class FaultSpec:
    name: str
    rank: int | None = None  # None: the last rank
    step: int = 2
    value: str | None = None

    def target_rank(self, world_size: int) -> int:
        return world_size - 1 if self.rank is None else self.rank


def parse_fault(text: str) -> FaultSpec:
    """Parse ``NAME[=VALUE][@RANK][:STEP]``; unknown names list the known ones."""
    m = _SPEC.match(text.strip())
    if not m:
        raise BadInput(f"bad --inject {text!r}; expected NAME[=VALUE][@RANK][:STEP]")
    if m["name"] not in FAULTS:
        raise BadInput(f"unknown fault {m['name']!r}; choose one of {', '.join(FAULTS) or '(none)'}")
    return FaultSpec(m["name"], int(m["rank"]) if m["rank"] else None,
                     int(m["step"]) if m["step"] else 2, m["value"])


def validate_faults(specs: tuple[FaultSpec, ...], world_size: int, steps: int) -> None:
    for s in specs:
        if s.rank is not None and not 0 <= s.rank < world_size:
            raise BadInput(f"fault {s.name}@{s.rank}: rank outside 0..{world_size - 1}")
        if s.step >= steps:
            raise BadInput(f"fault {s.name}:{s.step}: step outside 0..{steps - 1}")


class FaultInjector:
    """Applies the faults aimed at this rank; a no-op when there are none."""

    def __init__(self, specs: tuple[FaultSpec, ...], rank: int, world_size: int) -> None:
        self.specs = specs
        self.rank = rank
        self.world_size = world_size
        self.mine = [s for s in specs if s.target_rank(world_size) == rank]

    def on_model_built(self, model: nn.Module) -> None:
        pass

    def sync_config(self, cfg: SyncConfig) -> SyncConfig:
        return cfg

    def before_forward(self, step: int, model: nn.Module) -> None:
        pass

    def before_backward(self, step: int) -> None:
        pass

    def after_step(self, step: int, model: nn.Module) -> None:
        pass
