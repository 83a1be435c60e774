"""The compute canary's probe input: a slice of one rank's real micro-batch, sent to every rank
as tensors — never a pickle — and rebuilt into the tree of each rank's own call
(``canary.schedule`` schedules it; ``canary.probe`` runs the probe on it).

``capture``: the first ``PROBE_ROWS`` rows of every tensor whose first dimension is the batch's,
any other tensor whole; ints, floats, bools and None as they are. ``share``: a fixed-size int64
header broadcast from the owner, then the tensors' bytes. ``rebuild``: the shared leaves in the
receiving rank's own call tree; a leaf the header cannot describe (a string, an object) stays
the receiving rank's own.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch.utils._pytree import tree_flatten, tree_unflatten

PROBE_ROWS = 2  # rows of the owner's batch (2: BatchNorm in training mode needs > 1 value)
HEADER = 256  # int64 words of the input's description
MAX_DIMS = 8
_DTYPES: tuple[torch.dtype, ...] = (
    torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32,
    torch.int16, torch.int8, torch.uint8, torch.bool, torch.complex64, torch.complex128)
TENSOR, INT, FLOAT, BOOL, NONE, OTHER = range(1, 7)
_GRAD_BIT = 8  # a tensor's dtype code carries its requires_grad flag above this bit


@dataclass
class ProbeInput:
    """A rank's view of the probe's input: the tree of its own call (``spec``) and one value
    per leaf (the owner's slice once shared; the rank's own value where it cannot be sent)."""

    spec: Any
    leaves: list[Any]


def capture(args: tuple, kwargs: dict) -> ProbeInput:
    """The slice of this call's input the probe would use: ``PROBE_ROWS`` rows of each
    batch-major tensor (cloned, so a caller that reuses its buffers changes nothing here)."""
    leaves, spec = tree_flatten((args, kwargs))
    tensors = [t for t in leaves if isinstance(t, torch.Tensor) and t.dim() > 0]
    batch = tensors[0].shape[0] if tensors else None
    out = []
    for leaf in leaves:
        if isinstance(leaf, torch.Tensor):
            rows = leaf.dim() > 0 and leaf.shape[0] == batch
            leaf = (leaf[:PROBE_ROWS] if rows else leaf).detach().clone().requires_grad_(
                leaf.requires_grad)
        out.append(leaf)
    return ProbeInput(spec, out)


def _describe(leaves: Sequence[Any]) -> tuple[list[int], list[torch.Tensor]] | None:
    """The header words and the tensors to send of an input; None when it does not fit."""
    words, tensors = [len(leaves)], []
    for leaf in leaves:
        if isinstance(leaf, torch.Tensor):
            if leaf.dtype not in _DTYPES or leaf.dim() > MAX_DIMS or leaf.is_sparse:
                return None
            words += [TENSOR, _DTYPES.index(leaf.dtype) | leaf.requires_grad << _GRAD_BIT,
                      leaf.dim(), *leaf.shape]
            tensors.append(leaf)
        elif isinstance(leaf, bool):
            words += [BOOL, int(leaf)]
        elif isinstance(leaf, int) and -(1 << 63) <= leaf < 1 << 63:
            words += [INT, leaf]
        elif isinstance(leaf, float):
            words += [FLOAT, struct.unpack("<q", struct.pack("<d", leaf))[0]]
        elif leaf is None:
            words += [NONE]
        else:
            words += [OTHER]
    return (words, tensors) if len(words) <= HEADER else None


def share(mine: ProbeInput | None, owner: int, group, device: torch.device
          ) -> list[Any] | None:
    """The owner's leaves on every rank: its header broadcast (a fixed ``HEADER`` words, so
    every rank sends the same size whatever it holds), then its tensors' bytes (a size every
    rank read from that header). None on every rank when the owner has no input to share.
    ``mine``: the owner's capture (ignored elsewhere); ``owner``: a rank of ``group``."""
    is_owner = dist.get_rank(group) == owner
    described = _describe(mine.leaves) if is_owner and mine is not None else None
    header = torch.zeros(HEADER + 1, dtype=torch.int64)
    if described is not None:
        words, tensors = described
        nbytes = sum(t.numel() * t.element_size() for t in tensors)
        header[:len(words) + 1] = torch.tensor([nbytes, *words])
    header = header.to(device)
    src = dist.get_global_rank(group, owner)
    dist.broadcast(header, src, group=group)
    head = header.tolist()
    if head[1] == 0:
        return None
    payload = torch.empty(head[0], dtype=torch.uint8, device=device)
    if is_owner and head[0]:
        payload.copy_(torch.cat([t.contiguous().reshape(-1).view(torch.uint8).to(device)
                                 for t in tensors]))
    if head[0]:
        dist.broadcast(payload, src, group=group)
    return _decode(head[1:], payload)


def _decode(words: list[int], payload: torch.Tensor) -> list[Any]:
    """The leaves a header and payload describe (``OTHER``: a placeholder, kept local)."""
    leaves, at, offset = [], 0, 0
    for _ in range(words[0] if words else 0):
        at += 1
        kind = words[at]
        if kind == TENSOR:
            code, ndim = words[at + 1], words[at + 2]
            dtype = _DTYPES[code & ((1 << _GRAD_BIT) - 1)]
            shape = words[at + 3:at + 3 + ndim]
            at += 2 + ndim
            n = dtype.itemsize
            for d in shape:
                n *= d
            leaf = payload[offset:offset + n].view(dtype).reshape(shape).clone()
            leaves.append(leaf.requires_grad_(bool(code >> _GRAD_BIT)))
            offset += n
        elif kind in (INT, BOOL, FLOAT):
            at += 1
            v = words[at]
            leaves.append(bool(v) if kind == BOOL else v if kind == INT
                          else struct.unpack("<d", struct.pack("<q", v))[0])
        elif kind == NONE:
            leaves.append(None)
        else:
            leaves.append(_OTHER)
    return leaves


_OTHER = object()


def rebuild(local: ProbeInput | None, shared: list[Any], device: torch.device
            ) -> tuple[tuple, dict] | None:
    """The probe's ``(args, kwargs)`` on this rank: the shared leaves in its own call's tree
    (a leaf sent as ``OTHER`` keeps this rank's value); None when the trees do not match."""
    if local is None or len(local.leaves) != len(shared):
        return None
    leaves = []
    for mine, theirs in zip(local.leaves, shared):
        if theirs is _OTHER:
            leaves.append(mine)
        elif isinstance(theirs, torch.Tensor):
            where = mine.device if isinstance(mine, torch.Tensor) else device
            leaves.append(theirs.detach().to(where).requires_grad_(theirs.requires_grad))
        else:
            leaves.append(theirs)
    return tree_unflatten(leaves, local.spec)
