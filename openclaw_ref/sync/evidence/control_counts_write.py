"""What one rank writes into the hardened hook's step block (``control_counts`` defines the
counts, their layout and the clean check): its count rows, its ready detail or bin, its replica
digest's bits — built on the host as one image of the whole block and copied in once, because a
rank's slots are known on the host and a few Python byte operations per bucket cost less than
the tensor operations that would expand them. Only what lives on a device (an accelerator's NaN
flags, its replica digest) is written there, after the copy, with no host read."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from openclaw_ref.sync.evidence.control_counts import (
    ACTIVE,
    COUNT_FIELDS,
    DETAIL_FIELDS,
    DIGEST_BITS,
    HIST_BINS,
    NONFINITE_COUNT,
    STEP_FIELDS,
    CountLayout,
    ready_bin,
)
from openclaw_ref.sync.evidence.control_layout import (
    CHUNK_BITS,
    MAGIC,
    MAGIC_JOINED,
    NONFINITE,
    READY,
)

_BIT_BYTES = [bytes((c >> s) & 1 for s in range(CHUNK_BITS - 1, -1, -1))
              for c in range(1 << CHUNK_BITS)]
_IDLE = bytes(COUNT_FIELDS - 2)


def count_row(slot: Sequence[int]) -> bytes:
    """One rank's ``COUNT_FIELDS`` counts for one bucket from its slot (0..255 chunks): active,
    joined, the agreed chunks' bits (most significant first), its non-finite flag. A slot whose
    magic is neither active nor joined contributes nothing (a rank that wrote nothing). Host
    bytes: a slot is known on the host, and joining 17 precomputed 8-byte bit patterns costs
    less than the tensor operations (or a Python list of 139 ints) that would expand it."""
    if slot[0] == MAGIC:
        return (b"\x01\x00" + b"".join([_BIT_BYTES[c] for c in slot[1:NONFINITE]])
                + bytes((slot[NONFINITE],)))
    return bytes((0, int(slot[0] == MAGIC_JOINED))) + _IDLE


def digest_bytes(digest: int) -> bytes:
    """The 64 bits of a digest (any int, taken modulo 2^64), most significant first, one byte
    each: ``digest_bits`` on the host."""
    v = digest & ((1 << DIGEST_BITS) - 1)
    return b"".join([_BIT_BYTES[(v >> s) & 0xFF] for s in range(DIGEST_BITS - 8, -1, -8)])


def slot_units(slot: Sequence[int]) -> int:
    """The slot's ready time in ``READY_UNIT_US`` units."""
    c = slot[READY]
    return (c[0] << 16) | (c[1] << 8) | c[2]


def _with_bin(counts: bytes, slot: Sequence[int]) -> bytes:
    hist = bytearray(HIST_BINS)
    if counts[ACTIVE]:
        hist[ready_bin(slot_units(slot))] = 1
    return counts + hist


def _detail(counts: bytes, slot: Sequence[int]) -> bytes:
    """Counts, then this rank's ready detail: its active marker and 3 ready chunks."""
    return counts + (bytes((1, *slot[READY])) if counts[ACTIVE] else bytes(DETAIL_FIELDS))


def digest_bits(digest: torch.Tensor) -> torch.Tensor:
    """The 64 bits of a 0-dim int64 digest, most significant first, on its device (the shifts
    are made there: no host-to-device copy, no stream synchronization)."""
    shifts = torch.arange(DIGEST_BITS - 1, -1, -1, device=digest.device)
    return torch.bitwise_right_shift(digest, shifts).bitwise_and_(1)


def write_counts(block: torch.Tensor, layout: CountLayout, rank: int,
                 slots: torch.Tensor | Sequence[Sequence[int]],
                 flags: torch.Tensor | Sequence[bool] | None = None,
                 replica: torch.Tensor | int | None = None) -> None:
    """Fill ``block`` (``layout.size(B)`` elements, any wire dtype, any device) with this rank's
    contribution: zeros, its counts in its group, its ready detail or bin, its step row.
    ``slots``: B slots (lists or a (B, SLOT_FIELDS) int64 tensor) on the host; ``flags``: the
    non-finite flag of each active slot's gradients — host booleans, or a (B,) tensor on the
    block's device, 0 where finite and nonzero or NaN where not, never read on the host (None:
    as in the slots); ``replica``: the digest of this step's parameter slice, a Python int or
    a 0-dim int64 on the block's device (None: abstain). Everything known on the host goes in
    with ONE copy of a host image of the whole block (every value is 0..255); only device
    flags and a device digest are written on the device after it."""
    rows = slots.tolist() if isinstance(slots, torch.Tensor) else slots
    B, G = len(rows), layout.groups
    g = rank // layout.group_size
    counts_at = g * COUNT_FIELDS
    ready_at = G * COUNT_FIELDS + (rank * DETAIL_FIELDS if layout.detail else g * HIST_BINS)
    shape = _detail if layout.detail else _with_bin
    on_host = flags is not None and not isinstance(flags, torch.Tensor)
    image = bytearray(layout.size(B))
    for b, slot in enumerate(rows):
        row = shape(count_row(slot), slot)
        at = b * layout.row
        image[at + counts_at:at + counts_at + COUNT_FIELDS] = row[:COUNT_FIELDS]
        image[at + ready_at:at + ready_at + len(row) - COUNT_FIELDS] = row[COUNT_FIELDS:]
        if on_host and row[ACTIVE] and flags[b]:
            image[at + counts_at + NONFINITE_COUNT] = 1
    step_at = B * layout.row + g * STEP_FIELDS
    if isinstance(replica, int):
        image[step_at:step_at + STEP_FIELDS] = b"\x01" + digest_bytes(replica)
    if image:
        block.copy_(torch.frombuffer(image, dtype=torch.uint8), non_blocking=True)
    if isinstance(flags, torch.Tensor) and B:
        nonfinite = block[:B * layout.row].view(B, layout.row)[:, counts_at + NONFINITE_COUNT]
        if all(s[0] == MAGIC for s in rows):
            nonfinite.copy_(flags)
        else:
            active = torch.tensor([float(s[0] == MAGIC) for s in rows], dtype=block.dtype)
            nonfinite.copy_(flags.to(block.dtype) * active.to(block.device, non_blocking=True))
    if isinstance(replica, torch.Tensor):
        block[step_at] = 1
        block[step_at + 1:step_at + STEP_FIELDS] = digest_bits(replica).to(block.dtype)
