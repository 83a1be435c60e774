"""Stock PyTorch DDP, the baseline: exactly what a user gets without this suite — with no comm
hook, or with one of PyTorch's own hooks (``torch.distributed.algorithms.ddp_comm_hooks``)
registered as a user would register it.

Invariant: every strategy here is DDP built by ``wrap_ddp`` plus at most one of PyTorch's hooks,
run as PyTorch ships it (no arithmetic of ours); a column of the fault × hook matrix is one of
these classes, named by its ``--sync`` name."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any, ClassVar

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
from torch.nn.parallel import DistributedDataParallel as DDP

from openclaw_ref.arms.config import ArmConfig
from openclaw_ref.arms.strategy import SyncStrategy
from openclaw_ref.sync.base import RankInfo, Wire

CommHook = Callable[[Any, dist.GradBucket], torch.futures.Future[torch.Tensor]]

# PowerSGD's settings for the ``ddp-powersgd`` column. Rank 1 with error feedback and warm start
# (PyTorch's defaults for both). ``start_powerSGD_iter`` = 2, the smallest PowerSGDState accepts
# with error feedback: steps 0 and 1 are vanilla allreduce (DDP may rebuild its buckets after
# step 0, and the error-feedback buffers are kept per bucket index), compression from step 2
# on — the step at which the fault matrix injects, so every fault meets compressed buckets.
POWERSGD_RANK = 1
POWERSGD_START_ITER = 2
POWERSGD_SEED = 0  # every replica draws the same initial Q
# PyTorch's default 0 divides by a zero norm when a whole matrix has no gradient (an idle
# expert of the sparse model): the first compressed step turned every parameter into NaN
# (measured). 1e-8 is the value PyTorch's own error message recommends.
POWERSGD_EPSILON = 1e-8


def wrap_ddp(model: nn.Module, ctx: RankInfo, cfg: ArmConfig) -> DDP:
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
    """``ddp``: DistributedDataParallel with its default fp32 allreduce (no hook)."""

    name = "ddp"
    hook_wire: ClassVar[Wire] = Wire.NATIVE  # what the hook puts on the wire

    def wrap(self, model: nn.Module, ctx: RankInfo) -> nn.Module:
        self.ddp = wrap_ddp(model, ctx, self.cfg)
        state_and_hook = self.comm_hook(self.ddp)
        if state_and_hook is not None:
            self.ddp.register_comm_hook(*state_and_hook)
        return self.ddp

    def comm_hook(self, ddp: DDP) -> tuple[Any, CommHook] | None:
        """The (state, hook) to register on ``ddp``; None: DDP's built-in allreduce."""
        return None


def is_stock(factory: object) -> bool:
    """Whether a ``STRATEGIES`` entry is DDP plus at most one of PyTorch's hooks and nothing
    else: a ``StockDDP`` class that does not change how DDP is built (``ddp-detail`` does)."""
    return (isinstance(factory, type) and issubclass(factory, StockDDP)
            and factory.wrap is StockDDP.wrap)


class AllreduceHookDDP(StockDDP):
    """``ddp-allreduce``: PyTorch's ``default_hooks.allreduce_hook`` (divide by W, then an fp32
    SUM allreduce): what stock DDP computes, through the Python hook path."""

    name = "ddp-allreduce"

    def comm_hook(self, ddp: DDP) -> tuple[Any, CommHook]:
        return ddp.process_group, default_hooks.allreduce_hook


class StockDDPFP16(StockDDP):
    """``ddp-fp16``: DDP with PyTorch's ``fp16_compress_hook`` (casts to fp16 *before* dividing
    by the world size, so a local element at or above 65520 becomes inf on the wire)."""

    name = "ddp-fp16"
    hook_wire = Wire.FP16

    def comm_hook(self, ddp: DDP) -> tuple[Any, CommHook]:
        return ddp.process_group, default_hooks.fp16_compress_hook


def bf16_compress(process_group, bucket):  # no annotations: DDP rejects string ones
    """PyTorch's ``bf16_compress_hook``, called as is. Registered under this name because DDP's
    ``register_comm_hook`` refuses any function *named* ``bf16_compress_hook`` without CUDA and
    NCCL 2.10; the hook body itself needs only a backend that reduces bf16, which gloo does."""
    return default_hooks.bf16_compress_hook(process_group, bucket)


class BF16HookDDP(StockDDP):
    """``ddp-bf16``: PyTorch's ``bf16_compress_hook`` (cast to bf16, ÷W, SUM, cast back)."""

    name = "ddp-bf16"
    hook_wire = Wire.BF16

    def comm_hook(self, ddp: DDP) -> tuple[Any, CommHook]:
        return ddp.process_group, bf16_compress


def powersgd_in_bucket_order(state, bucket):  # no annotations: DDP rejects string ones
    """PyTorch's ``powerSGD_hook``, one bucket at a time: it returns only once this bucket's
    allreduces are done. The hook issues its P and Q allreduces from future callbacks; on gloo
    those callbacks run when the previous allreduce completes, so with two buckets in flight
    the ranks can issue them in different orders and gloo aborts the process (measured here:
    "Received data size doesn't match expected size", 2992 vs 204 bytes). Waiting keeps every
    rank's collective order the bucket order; the arithmetic is PyTorch's, unchanged."""
    fut = powerSGD_hook.powerSGD_hook(state, bucket)
    fut.wait()
    return fut


class PowerSGDDDP(StockDDP):
    """``ddp-powersgd``: PyTorch's ``powerSGD_hook`` at rank ``POWERSGD_RANK`` with error
    feedback, vanilla allreduce before step ``POWERSGD_START_ITER`` (see there), buckets
    synchronized one after the other (``powersgd_in_bucket_order``). Vectors (biases, norms)
    and matrices too small to gain are allreduced uncompressed, as PyTorch decides."""

    name = "ddp-powersgd"

    def comm_hook(self, ddp: DDP) -> tuple[Any, CommHook]:
        self.powersgd = powerSGD_hook.PowerSGDState(
            ddp.process_group, matrix_approximation_rank=POWERSGD_RANK,
            start_powerSGD_iter=POWERSGD_START_ITER, use_error_feedback=True, warm_start=True,
            orthogonalization_epsilon=POWERSGD_EPSILON, random_seed=POWERSGD_SEED)
        return self.powersgd, powersgd_in_bucket_order
