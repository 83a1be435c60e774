"""What a conformance run trains (``ConformSettings``) and what a check answers
(``CheckResult``): the vocabulary shared by the checks, the cluster driver, the report and the
fault matrix.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from dataclasses import dataclass, field

from openclaw_ref.arms.config import ArmConfig
from openclaw_ref.core.config import TRAIN_PRESETS, ModelSection, TrainSection
from openclaw_ref.core.faults import FaultSpec

SEED_OVERFLOW_RATE = 0.00017  # the seed's F3: 0.017 % of elements
SEED_SPARSITY_RANGE = (0.12, 0.68)


@dataclass(frozen=True)
class ConformSettings:
    """What a conformance run trains: small enough to run many times on two CPU cores."""

    sync: ArmConfig = field(default_factory=ArmConfig)
    model: ModelSection = field(default_factory=ModelSection)  # sparsity: the seed's range
    # the global batch is rounded up to a multiple of the world size
    train: TrainSection = TRAIN_PRESETS["conformance"]
    hdr_loss_scale: float = 1.0  # overflow workload: the loss is scaled by this (like AMP)
    hdr_spread_decades: float = 0.0  # ... and each element by 10^U(-d, d) (0: real gradients,
    # whose max/min already exceeds 1e4 — measured and reported as min_dynamic_range)
    faults: tuple[str, ...] = ("permuted-params", "scale-mismatch", "missing-grad", "nan-grad",
                               "bitflip", "late-rank=250ms")

    def train_config(self, world_size: int, faults: tuple[FaultSpec, ...] = (),
                     sync: ArmConfig | None = None, steps: int | None = None):
        from openclaw_ref.core.train import TrainConfig

        batch = world_size * math.ceil(self.train.global_batch / world_size)  # divisible by W
        train = dataclasses.replace(self.train, global_batch=batch,
                                    steps=steps or self.train.steps)
        return TrainConfig.from_sections(self.model, train, world_size=world_size,
                                         sync=sync or self.sync, faults=faults, backend="auto",
                                         progress=False)


class Role(enum.StrEnum):
    """A row's part in the verdict: a ``check`` of the hook (it can fail the run), or a
    ``property`` of the model measured beside the checks (reported, never a failure)."""

    CHECK = "check"
    PROPERTY = "property"


@dataclass
class CheckResult:
    """One check's verdict; identical on every rank. A ``Role.PROPERTY`` row always has
    ``passed`` True: it describes the model, not the hook."""

    check: str
    strategy: str
    passed: bool
    detail: str
    figures: dict = field(default_factory=dict)
    event: dict | None = None  # the first disagreement: step, ranks, params/bucket
    role: Role = Role.CHECK

    def to_json(self) -> dict:
        return dataclasses.asdict(self)
