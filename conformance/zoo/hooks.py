"""Comm hooks for the zoo, each a ``CALLABLE(ddp_model, process_group)`` as ``--openclaw-hook``
takes it: the correct ones a user brings, and broken ones whose mistake is known.

Correct (each must pass the suite on every model whose gradients it supports):
  ``allreduce``          PyTorch's ``default_hooks.allreduce_hook``
  ``fp16_compress``      PyTorch's ``default_hooks.fp16_compress_hook`` (fp16 wire)
  ``bf16_cast``          a bf16 wire that casts itself: PyTorch's ``bf16_compress_hook`` refuses
                         anything but CUDA 11+/NCCL 2.10+ (or XPU), so on gloo a bf16 wire must
                         do its own cast; this one casts, divides, sums and casts back
  ``hardened``           ``harden()`` from the hook library, at its default configuration (the
                         step guard: no comm hook, DDP's own reduction)
  ``hardened_per_bucket``  ``harden()``'s per-bucket guard (a Python comm hook); its cells run
                         under ``slow``

Broken (each must fail, naming the check, and the rank where the mistake has one):
  ``no_divide``          sums the ranks' gradients without dividing by the world size
  ``one_rank_scaled``    rank 1 doubles its bucket before the (otherwise correct) average
  ``reversed_bucket``    averages, then returns the bucket's per-parameter slices in reverse
                         order (as a hook that unpacks ``bucket.gradients()`` backwards would);
                         in a bucket of a single parameter this changes nothing
  ``unreduced_on_one_rank``  every rank joins the allreduce, but rank 1 returns its own local
                         bucket instead of the result

Every hook works on ``ddp_model.process_group`` (a hook that reduced over the default group
would sum over the wrong ranks under a sub-group) and leaves sparse buckets (``nn.Embedding
(sparse=True)``) to a plain average where its mistake has no meaning for them.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

FAULTY_RANK = 1  # the rank whose contribution the one-rank mistakes corrupt


def _average(group, tensor: torch.Tensor) -> torch.futures.Future:
    """Divide ``tensor`` by the group's size and allreduce it in place; the future's value is
    the averaged tensor (PyTorch's ``allreduce_hook``, spelled out)."""
    tensor.div_(dist.get_world_size(group))
    work = dist.all_reduce(tensor, group=group, async_op=True)
    return work.get_future().then(lambda fut: fut.value()[0])


# --- correct ---------------------------------------------------------------------------------

def allreduce(ddp_model, process_group) -> None:
    ddp_model.register_comm_hook(process_group, default_hooks.allreduce_hook)


def fp16_compress(ddp_model, process_group) -> None:
    ddp_model.register_comm_hook(process_group, default_hooks.fp16_compress_hook)


def _bf16_cast_hook(group, bucket):  # no annotations: DDP rejects string ones
    buffer = bucket.buffer()
    wire = buffer.to(torch.bfloat16).div_(dist.get_world_size(group))
    work = dist.all_reduce(wire, group=group, async_op=True)

    def decompress(fut: torch.futures.Future) -> torch.Tensor:
        buffer.copy_(fut.value()[0])
        return buffer

    return work.get_future().then(decompress)


def bf16_cast(ddp_model, process_group) -> None:
    ddp_model.register_comm_hook(process_group, _bf16_cast_hook)


def hardened(ddp_model, process_group) -> None:
    from openclaw_ref.sync import SyncConfig, harden

    harden(ddp_model, SyncConfig())


def hardened_per_bucket(ddp_model, process_group) -> None:
    """``harden()``'s forensic guard: a Python comm hook that checks every bucket."""
    from openclaw_ref.sync import SyncConfig, harden

    harden(ddp_model, SyncConfig(guard="bucket"))


# --- broken ----------------------------------------------------------------------------------

def _summing_hook(group, bucket):
    work = dist.all_reduce(bucket.buffer(), group=group, async_op=True)
    return work.get_future().then(lambda fut: fut.value()[0])


def no_divide(ddp_model, process_group) -> None:
    ddp_model.register_comm_hook(process_group, _summing_hook)


def _one_rank_scaled_hook(group, bucket):
    buffer = bucket.buffer()
    if dist.get_rank(group) == FAULTY_RANK:
        buffer.mul_(2.0)
    return _average(group, buffer)


def one_rank_scaled(ddp_model, process_group) -> None:
    ddp_model.register_comm_hook(process_group, _one_rank_scaled_hook)


def _reversed_hook(group, bucket):
    buffer = bucket.buffer()
    if buffer.is_sparse:
        return _average(group, buffer)
    sizes = [g.numel() for g in bucket.gradients()]

    def unpack_backwards(fut: torch.futures.Future) -> torch.Tensor:
        pieces = fut.value()[0].split(sizes)
        return torch.cat(list(reversed(pieces)))

    buffer.div_(dist.get_world_size(group))
    return dist.all_reduce(buffer, group=group, async_op=True).get_future().then(
        unpack_backwards)


def reversed_bucket(ddp_model, process_group) -> None:
    ddp_model.register_comm_hook(process_group, _reversed_hook)


def _unreduced_hook(group, bucket):
    buffer = bucket.buffer()
    local = buffer.clone()
    future = _average(group, buffer)
    if dist.get_rank(group) != FAULTY_RANK:
        return future
    return future.then(lambda fut: local)  # waits for the collective, then ignores it


def unreduced_on_one_rank(ddp_model, process_group) -> None:
    ddp_model.register_comm_hook(process_group, _unreduced_hook)


# name -> the wire it sends (sets the suite's tolerance); None is stock DDP (no hook)
CORRECT: dict[str | None, str] = {None: "native", "allreduce": "native",
                                  "fp16_compress": "fp16", "bf16_cast": "bf16",
                                  "hardened": "native", "hardened_per_bucket": "native"}
# correct hooks whose cells run under ``slow`` only (the CI budget): the same code as a CI cell
SLOW_HOOKS: frozenset[str] = frozenset({"hardened_per_bucket"})
BROKEN: tuple[str, ...] = ("no_divide", "one_rank_scaled", "reversed_bucket",
                           "unreduced_on_one_rank")
# the broken hooks whose mistake sits on one rank: the suite must name it
ONE_RANK: frozenset[str] = frozenset({"one_rank_scaled", "unreduced_on_one_rank"})
