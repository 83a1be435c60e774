"""``local``: no gradient synchronization at all — the compute-only floor for benchmarks.

Replicas diverge by design; never a training strategy. Exposed sync time of a strategy is its
step time minus this one's, measured in the same job.
"""

from __future__ import annotations

from torch import nn

from openclaw_ref.arms.strategy import SyncStrategy
from openclaw_ref.sync.base import RankInfo


class LocalOnly(SyncStrategy):
    name = "local"

    def wrap(self, model: nn.Module, ctx: RankInfo) -> nn.Module:
        return model
