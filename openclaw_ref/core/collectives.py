"""Small collectives over a live process group that tasks on every rank share.

Every function here is called by every rank of the group at the same point (a collective), and
returns the same value on every rank.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch.distributed as dist

if TYPE_CHECKING:
    from openclaw_ref.core.launch import RankContext


def gather(ctx: RankContext, obj: Any) -> list[Any]:
    """Every rank's ``obj``, in rank order, on every rank (one collective)."""
    if ctx.world_size == 1:
        return [obj]
    out: list[Any] = [None] * ctx.world_size
    dist.all_gather_object(out, obj)
    return out
