"""HSDP's replica check at the FSDP2 guard's ``close()``: every local shard compared once more
across the ranks that hold the same shards, as the DDP guards' ``replica_close`` does, so a
divergence after the last digested slice (or in a slice the rotation had not come back to) is
not lost when the run ends.

Why not ``replica_close`` itself: it compares over one group, and the replica dimension's group
holds only some ranks — those of one shard coordinate would raise while the others, which
compared equal replicas, went on to their next collective. Here one all-gather over the whole
mesh carries each rank's shard coordinate and per-parameter digests, so every rank judges the
same rows and raises the same error (``facts.replica_divergence``'s vote).

Invariant (``replica_close``'s): the gather runs only where every rank runs it — a guard that
digested at least one step, has not failed, and is not closed while an exception propagates;
a gather that fails (a peer gone) is recorded as not run, not raised.
"""

from __future__ import annotations

import sys
import warnings

import torch
import torch.distributed as dist

from openclaw_ref.sync.errors import Event, ReplicaDivergence, backend_message
from openclaw_ref.sync.evidence.replica_close import NOT_RUN
from openclaw_ref.sync.fsdp.facts import Field, replica_divergence


def due(guard, verify: bool) -> bool:
    return (verify and not guard.closed and not guard.failed and guard.replicas.enabled
            and guard.replicas.digested > 0 and sys.exc_info()[1] is None
            and dist.is_initialized())


def close_replica_check(guard) -> None:
    """Compare every parameter shard across its replicas (module docstring); raises
    ``ReplicaDivergence`` on every rank, naming the ranks (global) and the parameters."""
    shards = guard._local_shards()
    names = [n for n, _ in shards]
    mine = guard.replicas.digest.digests([t for _, t in shards]).cpu()
    row = torch.cat([torch.tensor([guard.replica_of], dtype=torch.int64), mine])
    gathered = [torch.empty_like(row) for _ in range(guard.world_size)]
    step = max(guard.opt_steps - 1, 0)
    try:
        dist.all_gather(gathered, row, group=guard.group)
    except RuntimeError as exc:
        detail = f"replica check at close() not run: {backend_message(exc)}"
        guard.events.append(Event(NOT_RUN, step, detail=detail))
        warnings.warn(f"openclaw: {detail}", RuntimeWarning, stacklevel=2)
        return
    table = [g.tolist() for g in gathered]
    off, params = [], []
    for i, name in enumerate(names):
        rows = [_row(t[0], t[1 + i]) for t in table]
        differ = replica_divergence(rows)
        if differ:
            params.append(name)
            off = sorted(set(off) | set(differ))
    if off:
        guard.failed = True
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
