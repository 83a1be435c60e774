"""Replica consistency riding in the step block: each step every active rank digests one slice
of the parameters DDP keeps equal, so every parameter is compared every K steps with no
collective beyond stock DDP's on a clean step.

The partition. The bytes of ``checks.synchronized_parameters`` (registration order, frozen
ones included), laid end to end, are cut into K ranges of equal size at element boundaries, so
every step digests T/K bytes whatever the parameter sizes (a large parameter is split across
steps) — a pure function of the parameter shapes and K, which the start-up check proves equal
on every rank. Step s digests slice s mod K (the clock every rank agrees on, checked in the
same block), one ``ReplicaDigest`` per piece (a parameter's part in the slice).

When. The digest is taken in the hook of the step's last bucket, inside backward: the
parameters are then what the previous optimizer step left, and the optimizer step of this step
has not run yet, so replicas that agree are bitwise equal at that moment — under ``no_sync``
accumulation (no hook: no digest, nothing changed), a skipped ``GradScaler`` step (nothing
changed on any rank), frozen and unused parameters (broadcast at construction, then only
changed by a fault). Buffers are not covered: a forward updates them on each rank from its own
batch (BatchNorm statistics), and DDP's broadcast makes them equal only at the start of the
next forward, after which that forward changes them again; the hook never sees a moment at
which they must be equal.

A mismatch (counts not 0 / n) makes every rank gather each rank's per-parameter digests of the
slice; ``divergence`` names the ranks whose slice digest differs from the majority
(``vote.majority``: with no strict majority, every rank) and the differing parameters, first
the first one in registration order.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from openclaw_ref.sync.errors import ReplicaDivergence
from openclaw_ref.sync.evidence.replica_digest import MAX_PLANS, ReplicaDigest
from openclaw_ref.sync.evidence.vote import majority, split_view

Piece = tuple[int, int, int]  # (parameter index, first element, end element)


def partition(shapes: Sequence[tuple[int, int]], k: int) -> list[list[Piece]]:
    """K slices of the parameters' bytes laid end to end in registration order, each of
    ⌊T/K⌋ or ⌈T/K⌉ bytes (T: all bytes), cut at element boundaries: slice j holds the pieces
    of the parameters its byte range meets. ``shapes``: (elements, bytes per element) per
    parameter. Together the slices cover every element exactly once."""
    total = sum(n * size for n, size in shapes)
    out: list[list[Piece]] = [[] for _ in range(k)]
    offset = 0
    for i, (n, size) in enumerate(shapes):
        end = offset + n * size
        for j in range(k):
            lo, hi = max(offset, j * total // k), min(end, (j + 1) * total // k)
            a, b = -(-(lo - offset) // size), -(-(hi - offset) // size)
            if lo < hi and a < b:
                out[j].append((i, a, b))
        offset = end
    return out


class ReplicaSlices:
    """The partition of the synchronized parameters and the digest of a step's slice."""

    def __init__(self, named: Sequence[tuple[str, nn.Parameter]], k: int) -> None:
        self.named = list(named)
        self.k = k
        self.slices = partition([(p.numel(), p.element_size()) for _, p in self.named],
                                max(k, 1))
        self.width = max((len(s) for s in self.slices), default=0)  # gather row length
        self.digest = ReplicaDigest(max_plans=max(MAX_PLANS, k + 1))
        self.last: torch.Tensor | list[int] | None = None  # per-piece digests, last slice
        self.on_host = all(p.device.type == "cpu" for _, p in self.named)
        self.last_slice = -1
        self.digested = 0  # slices digested so far (the close-time check needs one step run)
        if self.enabled:  # every slice's plan now: none is built (copied to a GPU) in backward
            for j in range(k):
                self.digest.prepare(self._pieces(j))

    def _pieces(self, index: int) -> list[torch.Tensor]:
        return [self.named[i][1].detach().reshape(-1)[a:b] for i, a, b in self.slices[index]]

    @property
    def enabled(self) -> bool:
        return self.k > 0 and bool(self.named)

    def digest_slice(self, clock: int) -> torch.Tensor | int:
        """The combined digest of slice ``clock mod K``; the per-parameter digests are kept
        for a gather. On a CPU a Python int (``ReplicaDigest.digests_on_host``: the same bits
        with ~20 fewer small torch ops per step); elsewhere a 0-dim int64 tensor on the
        parameters' device (no host synchronisation)."""
        self.last_slice = clock % self.k
        self.digested += 1
        pieces = self._pieces(self.last_slice)
        if self.on_host:
            self.last = self.digest.digests_on_host(pieces)
            return ReplicaDigest.combine_on_host(self.last)
        self.last = self.digest.digests(pieces) if pieces else torch.zeros(0, dtype=torch.int64)
        return ReplicaDigest.combine(self.last)

    def gather_row(self) -> list[int]:
        """This rank's row for the failure gather: 1 + slice index (0: no digest this step),
        then the per-piece digests padded with zeros to ``width``."""
        if self.last is None:
            return [0] * (1 + self.width)
        mine = self.last if isinstance(self.last, list) else self.last.tolist()
        return [1 + self.last_slice] + mine + [0] * (self.width - len(mine))

    def clear(self) -> None:
        self.last, self.last_slice = None, -1

    def divergence(self, rows: Sequence[Sequence[int]], active: Sequence[int], *,
                   step: int) -> ReplicaDivergence | None:
        """The error the gathered ``rows`` (one per rank) show among the ``active`` ranks, or
        None when their slice digests agree."""
        mine = [rows[r] for r in active if rows[r][0]]
        ranks = [r for r in active if rows[r][0]]
        if not mine:
            return None
        heads = [(row[0], tuple(row[1:])) for row in mine]
        vote = majority(heads)
        if not vote.differing:
            return None
        index = vote.reference[0] - 1
        names, split = [], ""
        for j, (p, _, _) in enumerate(self.slices[index]):
            values = [row[1 + j] for row in mine]
            odd = majority(values)
            if odd.differing and self.named[p][0] not in names:
                names.append(self.named[p][0])
                split = split or split_view([format(v & _MASK64, "016x") for v in values],
                                            odd, ranks)
        first = (f"first differing parameter {names[0]}, digest {split}" if names
                 else "the ranks digested different slices")
        return ReplicaDivergence(
            f"parameter replicas differ bitwise (slice {index} of {self.k}, digested before "
            f"this step's optimizer step): {first}", step=step,
            ranks=[ranks[i] for i in vote.differing], params=names)


_MASK64 = (1 << 64) - 1
