"""Stock PyTorch DDP, the baseline: exactly what a user gets without this suite."""

from __future__ import annotations

import warnings

from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

from openclaw_ref.sync.base import RankInfo, SyncConfig, SyncStrategy


def wrap_ddp(model: nn.Module, ctx: RankInfo, cfg: SyncConfig) -> DDP:
    """DDP as the openclaw model needs it: unused parameters (idle experts) are expected. The
    model has no buffers (its routing statistics are plain per-rank attributes), so DDP issues
    no buffer broadcast. ``cfg.ddp_options`` override these defaults (Lightning passes the
    user's DDP flags through here)."""
    options = {"device_ids": [ctx.device.index] if ctx.device.type == "cuda" else None,
               "find_unused_parameters": True, "bucket_cap_mb": cfg.bucket_cap_mb,
               **cfg.ddp_options}
    if options["find_unused_parameters"]:
        warnings.filterwarnings("ignore", message="find_unused_parameters=True was specified")
    return DDP(model, **options)


class StockDDP(SyncStrategy):
    """``ddp``: DistributedDataParallel with its default fp32 allreduce."""

    name = "ddp"

    def wrap(self, model: nn.Module, ctx: RankInfo) -> nn.Module:
        self.ddp = wrap_ddp(model, ctx, self.cfg)
        return self.ddp


class StockDDPFP16(StockDDP):
    """``ddp-fp16``: DDP with PyTorch's ``fp16_compress_hook`` (casts to fp16 *before* dividing
    by the world size, so a local element at or above 65520 becomes inf on the wire)."""

    name = "ddp-fp16"

    def wrap(self, model: nn.Module, ctx: RankInfo) -> nn.Module:
        ddp = super().wrap(model, ctx)
        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
        return ddp
