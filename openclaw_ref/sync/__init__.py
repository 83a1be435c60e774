"""Gradient-synchronization strategies, by the name the CLI uses (``--sync NAME``)."""

from __future__ import annotations

from typing import Callable

from openclaw_ref.errors import BadInput
from openclaw_ref.sync.base import SyncConfig, SyncStrategy
from openclaw_ref.sync.ddp import StockDDP, StockDDPFP16
from openclaw_ref.sync.local import LocalOnly

STRATEGIES: dict[str, Callable[[SyncConfig], SyncStrategy]] = {
    "ddp": StockDDP,
    "ddp-fp16": StockDDPFP16,
    "local": LocalOnly,
}


def make_strategy(cfg: SyncConfig) -> SyncStrategy:
    if cfg.name not in STRATEGIES:
        raise BadInput(f"unknown sync strategy {cfg.name!r}; choose one of {', '.join(STRATEGIES)}")
    return STRATEGIES[cfg.name](cfg)


__all__ = ["STRATEGIES", "SyncConfig", "SyncStrategy", "make_strategy"]
