"""HSDP's replica check at the FSDP2 guard's ``close()``: every local shard compared once more
across the ranks that hold the same shards, as the DDP guards' close does, so a divergence
after the last digested slice (or in a slice the rotation had not come back to) is not lost
when the run ends.

Why not the DDP guards' check (``GuardBase._verify_replicas``): it compares over one group, and
the replica dimension's group holds only some ranks — those of one shard coordinate would raise
while the others, which compared equal replicas, went on to their next collective. Here one
all-gather over the whole mesh carries each rank's shard coordinate and per-parameter digests,
so every rank judges the same rows and raises the same error (``facts.replica_divergence``'s
vote). When it runs, and a gather that fails: ``GuardBase``'s invariant.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from openclaw_ref.sync.errors import ReplicaDivergence
from openclaw_ref.sync.fsdp.facts import Field, replica_divergence
from openclaw_ref.sync.guard import GuardBase


def close_replica_check(guard: GuardBase, shards: list[tuple[str, torch.Tensor]],
                        replica_of: int) -> None:
    """Compare every parameter shard (``shards``: this rank's, at shard coordinate
    ``replica_of``) across its replicas (module docstring); raises ``ReplicaDivergence`` on
    every rank, naming the ranks (global) and the parameters, or the gather's
    ``RuntimeError``."""
    names = [n for n, _ in shards]
    mine = guard.replicas.digest.digests([t for _, t in shards]).cpu()
    row = torch.cat([torch.tensor([replica_of], dtype=torch.int64), mine])
    gathered = [torch.empty_like(row) for _ in range(guard.world_size)]
    step = guard.last_step
    dist.all_gather(gathered, row, group=guard.group)
    table = [g.tolist() for g in gathered]
    off, params = [], []
    for i, name in enumerate(names):
        rows = [_row(t[0], t[1 + i]) for t in table]
        differ = replica_divergence(rows)
        if differ:
            params.append(name)
            off = sorted(set(off) | set(differ))
    if off:
        err = ReplicaDivergence(
            "replicas of the same shards (HSDP, replicate_with_fsdp) differ bitwise at close(), "
            "after the last "
            f"optimizer step (every parameter compared; first differing: {params[0]}); with "
            "no majority among a shard's replicas (two replicas) every one is named: either may "
            "be the faulty one",
            step=step, ranks=[guard.global_ranks[r] for r in off], params=params)
        guard.events.append(err.event())
        raise err


def _row(replica_of: int, digest: int) -> list[int]:
    row = [0] * len(Field)
    row[Field.REPLICA_OF], row[Field.REPLICA] = replica_of, digest
    return row
