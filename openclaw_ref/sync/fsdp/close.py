"""The replica check at the FSDP2 guard's ``close()`` (HSDP, ``replicate_with_fsdp``, FSDP2 ×
TP): every local shard compared once more across the ranks that hold the same shards
(``mesh.Seat``), as the DDP guards' close does, so a divergence after the last digested slice
(or in a slice the rotation had not come back to) is not lost when the run ends.

Why not the DDP guards' check (``GuardBase._verify_replicas``): it compares over one group, and
the replica dimension's group holds only some ranks — those of one shard coordinate would raise
while the others, which compared equal replicas, went on to their next collective. Here one
all-gather over the whole mesh carries each rank's per-parameter replica keys and digests, so
every rank judges the same rows and raises the same error (``replicas.differing``'s vote).
When it runs, and a gather that fails: ``GuardBase``'s invariant.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist

from openclaw_ref.sync.errors import ReplicaDivergence
from openclaw_ref.sync.fsdp.replicas import differing
from openclaw_ref.sync.guard import GuardBase


def close_replica_check(guard: GuardBase, shards: list[tuple[str, torch.Tensor]],
                        keys: Sequence[int]) -> None:
    """Compare every parameter shard (``shards``: this rank's; ``keys``: each one's replica
    key, 0 where it has no replica) across its replicas (module docstring); raises
    ``ReplicaDivergence`` on every rank, naming the ranks (global) and the parameters, or the
    gather's ``RuntimeError``."""
    names = [n for n, _ in shards]
    mine = guard.replicas.digest.digests([t.reshape(-1) for _, t in shards]).cpu()
    row = torch.cat([torch.tensor(list(keys), dtype=torch.int64), mine])
    gathered = [torch.empty_like(row) for _ in range(guard.world_size)]
    step = guard.last_step
    dist.all_gather(gathered, row, group=guard.group)
    table = [g.tolist() for g in gathered]
    off, params = [], []
    for i, name in enumerate(names):
        differ, _ = differing(table, i, len(names) + i)
        if differ:
            params.append(name)
            off = sorted(set(off) | set(differ))
    if off:
        err = ReplicaDivergence(
            "replicas of the same shards (HSDP, replicate_with_fsdp, tensor parallel) differ "
            "bitwise at close(), after the last optimizer step (every parameter compared; first "
            f"differing: {params[0]}); with no majority among a shard's replicas (two "
            "replicas) every one is named: either may be the faulty one",
            step=step, ranks=[guard.global_ranks[r] for r in off], params=params)
        guard.events.append(err.event())
        raise err
