"""The gradient-synchronization strategies by the name the CLI uses (``--sync NAME``).

Invariant: every name here builds a ``SyncStrategy`` from a ``SyncConfig``; the seed's F5 hook
(a study exhibit) is imported only when a run asks for it."""

from __future__ import annotations

from collections.abc import Callable

from openclaw_ref.sync.base import SyncConfig, SyncStrategy
from openclaw_ref.sync.errors import BadInput
from openclaw_ref.sync.strategies.bucketed import Bucketed
from openclaw_ref.sync.strategies.ddp import (
    AllreduceHookDDP,
    BF16HookDDP,
    PowerSGDDDP,
    StockDDP,
    StockDDPFP16,
)
from openclaw_ref.sync.strategies.detail import DetailDDP
from openclaw_ref.sync.strategies.hardened import Hardened
from openclaw_ref.sync.strategies.local import LocalOnly


def _seed_f5(cfg: SyncConfig) -> SyncStrategy:
    """The seed's F5 hook as written: a study exhibit, imported only when a run asks for it."""
    from openclaw_ref.sync.strategies.seed_f5 import SeedF5

    return SeedF5(cfg)


STRATEGIES: dict[str, Callable[[SyncConfig], SyncStrategy]] = {
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


def make_strategy(cfg: SyncConfig) -> SyncStrategy:
    if cfg.name not in STRATEGIES:
        raise BadInput(f"unknown sync strategy {cfg.name!r}; choose one of {', '.join(STRATEGIES)}")
    return STRATEGIES[cfg.name](cfg)
