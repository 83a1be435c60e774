"""Reduced counted step blocks for the tests of ``control_counts``: slots, each rank's
contribution, the SUM, and the perturbations the property tests draw (a rank out of step on one
field, joined, silent, counted twice, non-finite).

A rank's slots are what ``encode_slot`` writes; a block is the SUM of every rank's
``write_counts`` in the wire dtype, exactly as the allreduce leaves it.
"""

from __future__ import annotations

import torch
from hypothesis import strategies as st

from openclaw_ref.sync.evidence.control_counts import CountLayout
from openclaw_ref.sync.evidence.control_counts_write import write_counts
from openclaw_ref.sync.evidence.control_layout import SLOT_FIELDS, encode_slot, joined_slot

WIRES = [torch.float32, torch.float16, torch.bfloat16]
SILENT = [0] * SLOT_FIELDS  # a slot no rank wrote: it counts nothing
PERTURB = st.sampled_from(["none", "clock", "bucket", "digest", "scale", "absent", "joined",
                           "empty", "twice", "nonfinite"])


def slot(clock=7, bucket=3, digest=0xDEADBEEF01234567, scale_exp=12, ready_s=0.0123,
         absent=None, nonfinite=False):
    return encode_slot(clock=clock, bucket=bucket, digest=digest, scale_exp=scale_exp,
                       ready_s=ready_s, absent=absent, nonfinite=nonfinite)


def contribution(layout: CountLayout, rank: int, slots: list[list[int]],
                 replica: int | None = None) -> torch.Tensor:
    """What rank ``rank`` writes for a step of ``len(slots)`` buckets."""
    block = torch.full((layout.size(len(slots)),), 9.0, dtype=layout.dtype)  # overwritten
    write_counts(block, layout, rank, torch.tensor(slots, dtype=torch.int64),
                 replica=None if replica is None else torch.tensor(replica, dtype=torch.int64))
    return block


def summed(parts: list[torch.Tensor]) -> torch.Tensor:
    """The SUM allreduce, in the wire dtype."""
    total = torch.zeros_like(parts[0])
    for p in parts:
        total += p
    return total


def perturbed(world: int, ready: list[int], perturb) -> tuple[list, list]:
    """(the slots today's block would hold, each rank's count contribution as slot lists):
    "empty" = a rank that wrote nothing, "twice" = a rank's contribution landing twice (two
    ranks in one slot today)."""
    slots = [slot(ready_s=ready[r] * 1e-5) for r in range(world)]
    writes = [[s] for s in slots]
    for kind, r in perturb:
        r %= world
        if kind == "joined":
            slots[r], writes[r] = joined_slot(), [joined_slot()]
        elif kind == "empty":
            slots[r], writes[r] = [0] * SLOT_FIELDS, []
        elif kind == "twice":
            other = slots[(r + 1) % world]
            slots[r] = [a + b for a, b in zip(slots[r], other)]
            writes[r] = writes[r] + [other]
        elif kind != "none":
            field = {"clock": "clock", "bucket": "bucket", "digest": "digest",
                     "scale": "scale_exp", "absent": "absent", "nonfinite": "nonfinite"}[kind]
            slots[r] = slot(ready_s=ready[r] * 1e-5, **{field: 1})
            writes[r] = [slots[r]]
    return slots, writes


def step_block(layout: CountLayout, buckets: int, ready: list[list[int]],
               perturb: list[tuple[str, int, int]], replicas: list[int | None]) -> torch.Tensor:
    """The reduced block of a step of ``buckets`` buckets: rank r's ready time in bucket b is
    ``ready[b][r]`` (10 µs units), each ``(kind, rank, bucket)`` of ``perturb`` is applied as in
    ``perturbed`` (bucket taken modulo ``buckets``), rank r digests ``replicas[r]`` (None:
    abstains). A rank whose contribution lands twice in some bucket writes a second
    contribution holding only that bucket."""
    world = layout.world_size
    writes = [perturbed(world, ready[b], [(k, r) for k, r, at in perturb if at % buckets == b])[1]
              for b in range(buckets)]
    parts = []
    for r in range(world):
        for k in range(max(len(writes[b][r]) for b in range(buckets))):
            slots = [writes[b][r][k] if len(writes[b][r]) > k else SILENT for b in range(buckets)]
            parts.append(contribution(layout, r, slots, replicas[r] if k == 0 else None))
    return summed(parts)
