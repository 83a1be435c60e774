"""The per-rank block path of the bucketed engine (``bucketed.py``): every bucket carries a
control block of one slot per rank (``sync.evidence.control_layout``'s slots, written at the
tail of the bucket's own allreduce), checked with a few tensor operations whatever the world
size (``check_blocks``), and judged by ``BlockLedger`` — the hook library's ``Ledger`` with the
per-rank blocks in place of ``harden()``'s counted one (``control_counts``, O(B) whatever W).

Why here and not in ``sync/``: ``harden()`` sends counts, and reads per-rank slots only through
the failure gather of a counted step; O(W) blocks per bucket are the engine's, measured beside
the counts by ``experiments/verify_scale.py`` and asv's ``VerifyScale``.

Size of a per-rank block: ``SLOT_FIELDS`` × W elements per bucket (88 B per rank in fp32):
0.72 MB per bucket at 8,192 ranks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from openclaw_ref.sync.evidence.control import BucketVerdict
from openclaw_ref.sync.evidence.control_layout import (
    ABSENT,
    CHUNK,
    MAGIC,
    MAGIC_AT,
    NONFINITE,
    READY,
    SLOT_FIELDS,
    units_to_ms,
)
from openclaw_ref.sync.evidence.ledger import BucketRecord, CountedStep, Ledger


def block_size(world_size: int) -> int:
    """Elements of one bucket's control block (one slot per rank)."""
    return SLOT_FIELDS * world_size


def write_block(block: torch.Tensor, rank: int, slot: Sequence[int]) -> None:
    """Fill ``block`` (``block_size(W)`` elements of the wire dtype): zeros, then our slot."""
    block.zero_()
    block[rank * SLOT_FIELDS:(rank + 1) * SLOT_FIELDS].copy_(
        torch.tensor(slot, dtype=block.dtype), non_blocking=True)


FOLD_COLUMNS = 1 + -(-(NONFINITE - 1) // 3) + 2  # magic, packed agreed chunks, ready, flag


def _fold_matrix(device: torch.device) -> torch.Tensor:
    """(SLOT_FIELDS, FOLD_COLUMNS): column 0 is the magic chunk alone; then the other agreed
    chunks three to a column (256² · a + 256 · b + c, an exact integer < 2^24 in fp32 and
    injective for chunks in 0..255); then the ready time as one integer; then the flag."""
    m = torch.zeros(SLOT_FIELDS, FOLD_COLUMNS, device=device)
    m[0, 0] = 1.0
    for c in range(1, NONFINITE):
        m[c, 1 + (c - 1) // 3] = float(CHUNK ** (2 - (c - 1) % 3))
    m[READY, FOLD_COLUMNS - 2] = torch.tensor([CHUNK * CHUNK, CHUNK, 1.0])
    m[NONFINITE, FOLD_COLUMNS - 1] = 1.0
    return m


READY_DETAIL_MAX_RANKS = 64  # per-rank ready times reach the host (metrics, plots) up to here


@dataclass(frozen=True)
class BlockCheck:
    """``check_blocks``' answer for the buckets of one step, already on the host."""

    ok: list[bool]  # False: decode the bucket and let ``verify`` judge and name
    verdicts: list[BucketVerdict | None]  # None where not ok


def check_blocks(blocks: torch.Tensor, indices: Sequence[int], rank: int,
                 extra: torch.Tensor | None = None) -> tuple[BlockCheck, list[float]]:
    """A fast, exact pass test of a step's reduced blocks ``(B, W * SLOT_FIELDS)`` on their
    own device, with one transfer to the host (``extra``, any 1-D tensor the caller needs on the
    host too, rides along; its values are returned).

    A bucket passes when every slot equals this rank's own slot ``rank`` in the agreed chunks,
    this rank's slot is an active one (magic ``MAGIC``) with no absent gradient, and no slot
    flags a non-finite gradient. That is exactly ``verify`` raising nothing and naming no
    non-finite rank, when no rank has joined: a missing slot, two ranks in one slot (magic
    2·0xA5), any clock/bucket/digest/scale difference or an absent gradient makes some slot
    differ from ours, and a slot that equals ours was written by one active rank, so its other
    chunks are valid too. A joined rank's slot differs as well: such buckets, like non-finite
    ones, are left to ``verify`` (neither is the hot path). Passing buckets get the skew (max −
    min ready time) and the late rank (the first at the max, as in ``verify``). Cost: about a
    dozen tensor operations per step over B·W·SLOT_FIELDS values, whatever W is; nothing per
    rank in Python."""
    B = blocks.shape[0]
    W = blocks.shape[1] // SLOT_FIELDS
    x = blocks.reshape(B, W, SLOT_FIELDS).to(torch.float32)  # chunks ≤ 255: exact
    # One product folds each slot into a few exact integers. A slot written by one rank has
    # chunks in 0..255, where the packing is injective, so it agrees with ours iff its folded
    # agreed columns do; a slot written by none or by several has a magic of 0 or k·0xA5,
    # which column 0 (the magic alone) tells apart whatever its other chunks hold.
    K = FOLD_COLUMNS  # folded column-major: every later operation reads contiguous rows
    folded = torch.mm(_fold_matrix(x.device).t(), x.reshape(B * W, SLOT_FIELDS).t())
    folded = folded.view(K, B, W)
    agreed = folded[:K - 2]
    units = folded[K - 2]  # (B, W)
    ok = ((agreed == agreed[:, :, rank:rank + 1]).all(0).all(1)
          & (folded[K - 1].amax(1) == 0)
          & (x[:, rank, MAGIC_AT] == MAGIC) & (x[:, rank, ABSENT] == 0).all(-1))
    parts = [ok.to(torch.float32), units.amax(1) - units.amin(1), units.argmax(1).float()]
    detail = W <= READY_DETAIL_MAX_RANKS
    if detail:
        parts.append(units.reshape(-1))
    flat = torch.cat(parts).double()
    if extra is not None:
        flat = torch.cat([flat, extra.to(torch.float64).reshape(-1)])
    host = flat.tolist()  # the one host synchronization
    oks = [v == 1.0 for v in host[:B]]
    verdicts: list[BucketVerdict | None] = []
    for b in range(B):
        ready = None
        if detail:
            ready = [units_to_ms(u) for u in host[3 * B + b * W:3 * B + (b + 1) * W]]
        verdicts.append(BucketVerdict(int(indices[b]), ready, units_to_ms(host[B + b]),
                                      int(host[2 * B + b])) if oks[b] else None)
    tail = 3 * B + (B * W if detail else 0)
    return BlockCheck(oks, verdicts), host[tail:]


class BlockLedger(Ledger):
    """``Ledger`` over per-rank blocks: each record's ``block`` is its bucket's reduced block,
    passed by ``check_blocks`` or judged by ``control.verify``."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._presence: torch.Tensor | None = None
        self.extra: list[float] = []  # the last step's ``presence``, on the host

    def settle(self, step: int, records: Sequence[BucketRecord], *, sync_ms: float,
               verify_started: float, counted: CountedStep | None = None,
               presence: torch.Tensor | None = None) -> bool:
        """``Ledger.settle``; ``presence``: a reduced tensor the engine needs on the host too
        (its presence counts), read in the same host sync; its values land in ``extra``."""
        self._presence = presence
        return super().settle(step, records, sync_ms=sync_ms, verify_started=verify_started,
                              counted=counted)

    def _verdicts(self, step: int, records: Sequence[BucketRecord], counted: CountedStep | None
                  ) -> tuple[list[BucketVerdict], list[float | None]]:
        if counted is not None:  # a counted step (``harden()``'s) is judged as the library does
            return super()._verdicts(step, records, counted)
        flagged, riders = self._riders(records, self._presence)
        blocks = torch.stack([r.block for r in records])
        checked, host = check_blocks(blocks, [r.index for r in records], self.rank, riders)
        self.extra = host[len(flagged):]
        verdicts = []
        for rec, ok, verdict in zip(records, checked.ok, checked.verdicts):
            self._bucket_judged()
            if not ok:
                verdict = self._verify(rec.block.tolist(), rec)
            verdicts.append(verdict)
            self._bucket_passed()
        return verdicts, self._flags(len(records), flagged, host)
