"""Replica consistency riding in the step block: each step every active rank digests one slice
of the parameters DDP keeps equal, so every parameter is compared every K steps with no
collective beyond stock DDP's on a clean step.

The partition. ``checks.synchronized_parameters`` (registration order, frozen ones included)
is cut into K contiguous slices of about equal bytes — a pure function of the parameter shapes
and K, which the start-up check proves equal on every rank. Step s digests slice s mod K (the
clock every rank agrees on, checked in the same block).

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
slice; ``divergence`` names the ranks whose slice digest differs from the plurality
(``vote.plurality``) and the differing parameters, first the first one in registration order.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from openclaw_ref.sync.control import split_view
from openclaw_ref.sync.errors import ReplicaDivergence
from openclaw_ref.sync.replica_digest import ReplicaDigest
from openclaw_ref.sync.vote import plurality


def partition(sizes: Sequence[int], k: int) -> list[list[int]]:
    """K contiguous slices of parameter indices with about equal bytes: parameter i goes to
    slice ⌊K · (bytes before i + half its bytes) / total⌋. Some slices may be empty (K > P)."""
    total = sum(sizes) or 1
    out: list[list[int]] = [[] for _ in range(k)]
    before = 0
    for i, n in enumerate(sizes):
        out[min(k - 1, (k * (2 * before + n)) // (2 * total))].append(i)
        before += n
    return out


class ReplicaSlices:
    """The partition of the synchronized parameters and the digest of a step's slice."""

    def __init__(self, named: Sequence[tuple[str, nn.Parameter]], k: int) -> None:
        self.named = list(named)
        self.k = k
        self.slices = partition([p.numel() * p.element_size() for _, p in self.named],
                                max(k, 1))
        self.width = max((len(s) for s in self.slices), default=0)  # gather row length
        self.digest = ReplicaDigest()
        self.last: torch.Tensor | None = None  # per-parameter digests of the last slice
        self.last_slice = -1

    @property
    def enabled(self) -> bool:
        return self.k > 0 and bool(self.named)

    def digest_slice(self, clock: int) -> torch.Tensor:
        """0-dim int64: the combined digest of slice ``clock mod K``, on the parameters' device
        (no host synchronisation); the per-parameter digests are kept for a gather."""
        self.last_slice = clock % self.k
        params = [self.named[i][1] for i in self.slices[self.last_slice]]
        self.last = self.digest.digests(params) if params else torch.zeros(0, dtype=torch.int64)
        return ReplicaDigest.combine(self.last)

    def gather_row(self) -> list[int]:
        """This rank's row for the failure gather: 1 + slice index (0: no digest this step),
        then the per-parameter digests padded with zeros to ``width``."""
        if self.last is None:
            return [0] * (1 + self.width)
        mine = self.last.tolist()
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
        _, off = plurality(heads)
        if not off:
            return None
        index = mine[[i for i in range(len(mine)) if i not in off][0]][0] - 1
        names, split = [], ""
        for j, p in enumerate(self.slices[index]):
            values = [row[1 + j] for row in mine]
            _, odd = plurality(values)
            if odd:
                names.append(self.named[p][0])
                split = split or split_view([format(v & _MASK64, "016x") for v in values],
                                            odd, ranks)
        first = (f"first differing parameter {names[0]}, digest {split}" if names
                 else "the ranks digested different slices")
        return ReplicaDivergence(
            f"parameter replicas differ bitwise (slice {index} of {self.k}, digested before "
            f"this step's optimizer step): {first}", step=step,
            ranks=[ranks[i] for i in off], params=names)


_MASK64 = (1 << 64) - 1
