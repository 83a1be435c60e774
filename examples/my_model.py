"""A model and comm hooks to point the conformance suite at (docs/conformance.md: "Run it on
your own model and hook").

  make_target      FACTORY(): a small MLP, a deterministic batch per (step, rank, world size)
                   and a mean loss, as ``openclaw_ref.conformance.target.Target``;
  make_batchnorm_target  FACTORY(): a 4-layer MLP with one ``nn.BatchNorm1d`` — not
                   shard-invariant (BatchNorm normalizes over each rank's shard), so N ranks of
                   any correct DDP differ from one process; the suite judges hooks against
                   stock DDP and reports that property in its own row;
  good_hook        CALLABLE(ddp_model, process_group): an allreduce hook that averages;
  forgets_to_divide  the same hook without the division by the world size (it sums): the
                   suite's equivalence check must fail on it, naming the ranks;
  hardened         ``harden()`` from the hook library instead of a hook of your own (replica
                   check every step, a NaN gradient raises, a 3 s watchdog: a collective a
                   rank never joins is named within seconds), which detects the suite's
                   faults and names the rank.

    pytest -m conformance --pyargs openclaw_ref.conformance.suite \
        --openclaw-model my_model:make_target --openclaw-hook my_model:good_hook
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from openclaw_ref.conformance.target import Target
from openclaw_ref.sync import SyncConfig, harden

FEATURES, CLASSES, PER_RANK = 16, 4, 8


def make_target() -> Target:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(FEATURES, 32), nn.ReLU(), nn.Linear(32, CLASSES))

    def batch(step: int, rank: int, world_size: int):
        g = torch.Generator().manual_seed(1000 * step + rank)  # rank-dependent: averaging matters
        x = torch.randn(PER_RANK, FEATURES, generator=g) * (1 + rank)
        return x, torch.randint(0, CLASSES, (PER_RANK,), generator=g)

    return Target(model, batch, F.cross_entropy, lr=0.1)


def make_batchnorm_target() -> Target:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(FEATURES, 32), nn.ReLU(), nn.Linear(32, 32),
                          nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(),
                          nn.Linear(32, CLASSES))

    def batch(step: int, rank: int, world_size: int):
        g = torch.Generator().manual_seed(1000 * step + rank)
        x = torch.randn(PER_RANK, FEATURES, generator=g) * (1 + rank)
        return x, torch.randint(0, CLASSES, (PER_RANK,), generator=g)

    return Target(model, batch, F.cross_entropy, lr=0.1)


def _allreduce(process_group, bucket, divide: bool):
    group = process_group if process_group is not None else dist.group.WORLD
    tensor = bucket.buffer()
    if divide:
        tensor.div_(dist.get_world_size(group))
    work = dist.all_reduce(tensor, group=group, async_op=True)
    return work.get_future().then(lambda fut: fut.value()[0])


def _averaging(process_group, bucket):
    return _allreduce(process_group, bucket, divide=True)


def _summing(process_group, bucket):
    return _allreduce(process_group, bucket, divide=False)


def good_hook(ddp_model, process_group) -> None:
    ddp_model.register_comm_hook(process_group, _averaging)


def forgets_to_divide(ddp_model, process_group) -> None:
    ddp_model.register_comm_hook(process_group, _summing)


def hardened(ddp_model, process_group) -> None:
    harden(ddp_model, SyncConfig(replica_slices=1, nonfinite="raise", watchdog_s=3.0))
