"""The benchmark's arms by the name the CLI uses (``--sync NAME``).

Invariant: every name here builds a ``SyncStrategy`` from an ``ArmConfig``; the seed's F5 hook
(a study exhibit) is imported only when a run asks for it."""

from __future__ import annotations

from collections.abc import Callable

from openclaw_ref.arms.bucketed import Bucketed
from openclaw_ref.arms.config import ArmConfig
from openclaw_ref.arms.ddp import (
    AllreduceHookDDP,
    BF16HookDDP,
    PowerSGDDDP,
    StockDDP,
    StockDDPFP16,
)
from openclaw_ref.arms.detail import DetailDDP
from openclaw_ref.arms.hardened import Hardened
from openclaw_ref.arms.local import LocalOnly
from openclaw_ref.arms.strategy import SyncStrategy
from openclaw_ref.sync.errors import BadInput


def _seed_f5(cfg: ArmConfig) -> SyncStrategy:
    """The seed's F5 hook as written: a study exhibit, imported only when a run asks for it."""
    from openclaw_ref.arms.seed_f5 import SeedF5

    return SeedF5(cfg)


STRATEGIES: dict[str, Callable[[ArmConfig], SyncStrategy]] = {
    "ddp": StockDDP,
    "ddp-allreduce": AllreduceHookDDP,  # PyTorch's own hooks, registered as users do
    "ddp-fp16": StockDDPFP16,
    "ddp-bf16": BF16HookDDP,
    "ddp-powersgd": PowerSGDDDP,
    "ddp-detail": DetailDDP,  # TORCH_DISTRIBUTED_DEBUG=DETAIL, the check to beat
    "local": LocalOnly,
    "hardened": Hardened,
    "bucketed": Bucketed,
    "seed-f5": _seed_f5,
}


def make_strategy(cfg: ArmConfig) -> SyncStrategy:
    if cfg.name not in STRATEGIES:
        raise BadInput(f"unknown sync strategy {cfg.name!r}; choose one of {', '.join(STRATEGIES)}")
    return STRATEGIES[cfg.name](cfg)
