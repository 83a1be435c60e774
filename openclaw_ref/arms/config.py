"""``ArmConfig``: what one benchmark arm runs with — its ``--sync`` name, the knobs only the
suite's own strategies read (the bucketed engine's plan and replica checks, how DDP is built),
and ``harden``, the ``SyncConfig`` a user would pass to ``harden()``, composed in whole.

Why composed and not merged: ``SyncConfig`` is the user's config, and holds only what
``harden()`` reads; an arm is more than that (stock DDP has a bucket cap, the bucketed engine a
planner), and the arms that harden DDP hand ``harden`` to ``harden()`` as a user would.

The run JSON records an arm flat (``to_json``: the name, the arm's fields and ``harden``'s, one
level), as it always has, so records written before the split read the same; ``of`` and
``replace`` take the same flat fields and route each to the config that declares it."""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass, field
from typing import Any

from openclaw_ref.sync.base import SyncConfig, as_choice
from openclaw_ref.sync.errors import BadInput

_HARDEN_FIELDS = tuple(f.name for f in dataclasses.fields(SyncConfig))


class Planner(enum.StrEnum):
    """The bucketed engine's plan (see ``bucket_plan``)."""

    STATIC = "static"
    NORM_EMA = "norm-ema"  # the seed's F2, on each rank's local norms
    NORM_EMA_AGREED = "norm-ema-agreed"


@dataclass(frozen=True)
class ArmConfig:
    """One arm: ``name`` (``registry.STRATEGIES``), ``harden`` (``harden()``'s knobs, which the
    bucketed engine reads too: wire, scale, watchdog) and the fields below, which ``harden()``
    never reads. ``planner`` accepts its enum or its string and always holds the enum."""

    name: str = "ddp"
    harden: SyncConfig = field(default_factory=SyncConfig)
    planner: Planner = Planner.STATIC
    bucket_cap_mb: float = 25.0  # torch DDP's default
    replica_check_every: int = 0  # bucketed engine: steps between replica checks; 0 = off
    # Keyword arguments for DistributedDataParallel (find_unused_parameters, static_graph,
    # gradient_as_bucket_view, ...) over the suite's defaults; bucket_cap_mb is the field above.
    ddp_options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "planner", as_choice(Planner, self.planner, "planner"))
        if self.bucket_cap_mb <= 0:
            raise BadInput(f"bucket cap must be positive; got {self.bucket_cap_mb}")
        if self.replica_check_every < 0:
            raise BadInput("replica check interval must be >= 0 (0 = off)")

    @classmethod
    def of(cls, name: str = "ddp", **fields: Any) -> ArmConfig:
        """The arm ``name`` with ``fields`` set, each on the config that declares it
        (``ArmConfig.of("hardened", wire="fp16", bucket_cap_mb=1.0)``)."""
        return cls(name=name).replace(**fields)

    def replace(self, **fields: Any) -> ArmConfig:
        """A copy with ``fields`` changed, each on the config that declares it."""
        knobs = {k: fields.pop(k) for k in list(fields) if k in _HARDEN_FIELDS}
        harden = dataclasses.replace(self.harden, **knobs) if knobs else self.harden
        return dataclasses.replace(self, harden=harden, **fields)

    def to_json(self) -> dict[str, Any]:
        """The flat record of the run JSON: the arm's fields and ``harden``'s, enums as text."""
        flat = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if f.name != "harden"}
        flat.update((k, getattr(self.harden, k)) for k in _HARDEN_FIELDS)
        return {k: (v.value if isinstance(v, enum.Enum) else v) for k, v in flat.items()}


def harden_defaults() -> ArmConfig:
    """The ``hardened`` arm exactly as users call ``harden(ddp)``: every field of its
    ``SyncConfig`` at its default. One definition, so the columns that claim to be ``harden()``
    as users call it (the fault matrix's, the corpus's) run exactly what ``harden()`` runs."""
    return ArmConfig(name="hardened")
