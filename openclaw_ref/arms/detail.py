"""``ddp-detail``: stock DDP under ``TORCH_DISTRIBUTED_DEBUG=DETAIL`` — the existing way to check
collective consistency, whose cost the hardened hook must beat.

Setting the environment variable itself does not work on gloo with torch 2.13: the DDP
constructor segfaults in ``c10d::Logger::set_env_variables`` (also when DDP is handed a DETAIL
group). What runs, and what this strategy does:

1. ``dist.set_debug_level(DETAIL)`` in the live process (DDP's own DETAIL behaviour: names of
   unused parameters in its errors, construction logging), then
2. ``dist.new_group()`` — created under DETAIL, torch wraps it in a ``ProcessGroupWrapper``, which
   before every collective runs a barrier and allgathers a fingerprint (op, shapes, dtypes,
   sequence number) and raises "Detected mismatch between collectives" on disagreement;
3. DDP is built on the default (unwrapped) group, so its constructor survives, and its gradient
   buckets are allreduced through the wrapped group by torch's stock ``allreduce_hook`` (the same
   divide-then-allreduce DDP does by itself). Every gradient collective therefore pays DETAIL's
   checks. Not routed through the wrapper: DDP's one-per-step allreduce of the "locally used"
   map (``find_unused_parameters``) and construction-time broadcasts, which stay on the default
   group.

The debug level is process-global; ``close`` restores the previous level and destroys the group.
"""

from __future__ import annotations

import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

from openclaw_ref.arms.ddp import StockDDP
from openclaw_ref.sync.base import RankInfo


class DetailDDP(StockDDP):
    """``ddp-detail``: DDP with DETAIL's collective-fingerprint checks on every gradient bucket."""

    name = "ddp-detail"

    def wrap(self, model: nn.Module, ctx: RankInfo) -> nn.Module:
        self._previous_level = dist.get_debug_level()
        dist.set_debug_level(dist.DebugLevel.DETAIL)
        self.group = dist.new_group(backend=ctx.backend)  # wrapped: created under DETAIL
        ddp = super().wrap(model, ctx)
        ddp.register_comm_hook(self.group, default_hooks.allreduce_hook)
        return ddp

    def summary(self) -> dict:
        return {"debug_level": "DETAIL", "gradient_group": "ProcessGroupWrapper"}

    def close(self, verify: bool = True) -> None:
        group = getattr(self, "group", None)
        if group is not None:
            self.group = None
            dist.destroy_process_group(group)
        if hasattr(self, "_previous_level"):
            dist.set_debug_level(self._previous_level)
