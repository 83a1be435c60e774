"""The replica check of the FSDP2 guard, for every mesh it guards (HSDP, ``replicate_with_fsdp``,
FSDP2 × TP in 2-D and 3-D): the columns a rank adds to the step's row, and the verdict over the
rows.

Parameters are grouped into *classes* by their placement pattern (``mesh.Seat``): on every rank
the same classes in the same order, so the row's layout is the same everywhere. A class whose
parameters have no replica adds nothing. Each other class adds three columns:

  KEY    1 + this rank's shard coordinate: the ranks with the same key hold replicas;
  VALUE  a digest of the class's local shards before the optimizer step: slice (step mod K)
         of them where FSDP2 itself keeps the replicas equal (HSDP's all-reduce), so the cost
         is T/K bytes a step; ALL of them, every step, where only the model's construction
         does (replicated over tp: norms and biases, small), so a drift is named at once;
  GRAD   (replicated over tp only) a digest of the class's reduced gradients, every step: a
         gradient DTensor never all-reduced over tp (a sequence-parallel norm left out of the
         plan) differs across the tp ranks before the optimizer applies it.

A differing VALUE is ``ReplicaDivergence``, a differing GRAD ``GradientsNotAveraged``; the ranks
are named by the one vote among each shard's replicas (two replicas: both). Which parameters
differ is not in the row (it stays O(classes) wide): the verdict is the same on every rank, so
every rank then gathers the class's per-parameter digests (``name_parameters``), once, on the
failure path only.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

from openclaw_ref.sync.errors import ConsistencyError, GradientsNotAveraged, ReplicaDivergence
from openclaw_ref.sync.evidence.replica_digest import ReplicaDigest
from openclaw_ref.sync.evidence.replica_slices import ReplicaSlices
from openclaw_ref.sync.evidence.vote import majority
from openclaw_ref.sync.fsdp.mesh import Seat


class Column(enum.IntEnum):
    """A class's columns, after the row's fixed fields."""

    KEY = 0
    VALUE = 1
    GRAD = 2


WIDTH = len(Column)


@dataclass
class ReplicaClass:
    """Parameters with one placement pattern that have replicas (module docstring)."""

    seat: Seat
    members: list[int]  # indices into the guard's tracked parameters
    values: ReplicaSlices

    @property
    def beyond(self) -> bool:
        """Replicated over a dim FSDP2 does not reduce over (tp)."""
        return bool(self.seat.beyond)

    def over(self) -> str:
        return ", ".join(self.seat.beyond)


@dataclass(frozen=True)
class Finding:
    """A class whose replicas differ: which column, which ranks (indices into the rows)."""

    index: int  # the class's position
    column: Column
    ranks: list[int]
    tie: bool


class Replicas:
    """The classes of one guard's tracked parameters, their columns and their verdict."""

    def __init__(self, seats: Sequence[Seat], shards: Sequence[tuple[str, torch.Tensor]],
                 k: int) -> None:
        by_pattern: dict[str, list[int]] = {}
        for i, seat in enumerate(seats):
            if seat.replicas > 1:
                by_pattern.setdefault(seat.pattern, []).append(i)
        self.classes: list[ReplicaClass] = []
        for pattern in sorted(by_pattern):
            members = by_pattern[pattern]
            seat = seats[members[0]]
            k_here = (1 if seat.beyond else k) if k else 0
            self.classes.append(ReplicaClass(seat, members, ReplicaSlices(
                [shards[i] for i in members], k_here)))
        self.k = k
        self.keys = [seat.key if seat.replicas > 1 else 0 for seat in seats]
        self.digest = ReplicaDigest()

    def summary(self) -> list[dict]:
        """Each class: its pattern, how many ranks hold each shard, the dims FSDP2 does not
        reduce over (tp), its parameters' count and its slice count."""
        return [{"pattern": c.seat.pattern, "replicas": c.seat.replicas,
                 "beyond": list(c.seat.beyond), "params": len(c.members), "slices": c.values.k}
                for c in self.classes]

    @property
    def width(self) -> int:
        return WIDTH * len(self.classes)

    @property
    def enabled(self) -> bool:
        """Whether any value is digested (the close-time check's condition)."""
        return any(c.values.enabled for c in self.classes)

    @property
    def digested(self) -> int:
        return max((c.values.digested for c in self.classes), default=0)

    def columns(self, clock: int, shards: Sequence[tuple[str, torch.Tensor]],
                grads: Sequence[torch.Tensor | None]) -> list[int]:
        """This rank's columns before optimizer step ``clock``: ``shards`` are the tracked
        parameters' local shards now (FSDP2 may re-seat them at its lazy init), ``grads`` their
        local reduced gradients."""
        out: list[int] = []
        for c in self.classes:
            value = 0
            if c.values.enabled:
                c.values.named = [shards[i] for i in c.members]
                value = int(c.values.digest_slice(clock))
            grad = self._grad_digest([grads[i] for i in c.members]) if c.beyond else 0
            out += [c.seat.key, value, grad]
        return out

    def _grad_digest(self, grads: Sequence[torch.Tensor | None]) -> int:
        return int(ReplicaDigest.combine_on_host(self.grad_digests(grads)))

    def grad_digests(self, grads: Sequence[torch.Tensor | None]) -> list[int]:
        """One digest per gradient (0 for none)."""
        present = [g.detach().reshape(-1) for g in grads if g is not None]
        got = iter(self.digest.digests(present).tolist() if present else [])
        return [next(got) if g is not None else 0 for g in grads]

    def findings(self, rows: Sequence[Sequence[int]], offset: int) -> list[Finding]:
        """Every class whose replicas differ in the rows (``offset``: the first class column),
        VALUE before GRAD (a drifted weight also changes the gradients it produces)."""
        out: list[Finding] = []
        for column in (Column.VALUE, Column.GRAD):
            for index, c in enumerate(self.classes):
                if column is Column.GRAD and not c.beyond:
                    continue  # FSDP2's own all-reduce keeps them equal; not digested
                at = offset + WIDTH * index
                off, tie = differing(rows, at + Column.KEY, at + column)
                if off:
                    out.append(Finding(index, column, off, tie))
        return out

    def error(self, finding: Finding, names: list[str], step: int, ranks: list[int],
              slices: int) -> ConsistencyError:
        """The error a finding is, worded for its class (``names``: the parameters that
        differ; ``ranks``: the global ranks named)."""
        c = self.classes[finding.index]
        either = ("; two replicas disagree: either may be the faulty one" if finding.tie
                  else "")
        if finding.column is Column.GRAD:
            return GradientsNotAveraged(
                f"gradient not reduced over {c.over()}: replicas over {c.over()} of these "
                f"parameters ({c.seat.pattern}) hold different reduced gradients before the "
                "optimizer step — a parameter the tensor-parallel plan left out under sequence "
                "parallel gets a gradient from its own rank's part of the sequence only, and "
                f"FSDP2 reduces it over its data-parallel ranks only{either}",
                step=step, ranks=ranks, params=names)
        if c.beyond:
            return ReplicaDivergence(
                f"replicas over {c.over()} ({c.seat.pattern}) differ bitwise before this "
                f"optimizer step (every such parameter digested each step){either}",
                step=step, ranks=ranks, params=names)
        return ReplicaDivergence(
            f"replicas of the same shards (HSDP, replicate_with_fsdp) differ bitwise (slice "
            f"{step % slices} of {slices}, digested before this optimizer step); a rank is "
            "named when its digest differs from the majority of its replicas; with no majority "
            "(two replicas) every replica is named: either may be the faulty one",
            step=step, ranks=ranks, params=names)

    def name_parameters(self, finding: Finding, shards: Sequence[tuple[str, torch.Tensor]],
                        grads: Sequence[torch.Tensor | None], group: dist.ProcessGroup
                        ) -> list[str]:
        """The parameters of the finding's class that differ among their replicas: one
        all-gather of every member's digest (a collective: every rank runs it, as every rank
        reads the same finding). Values are compared whole, so a parameter is named only if
        it differs now."""
        c = self.classes[finding.index]
        if finding.column is Column.GRAD:
            mine = self.grad_digests([grads[i] for i in c.members])
        else:
            mine = self.digest.digests([shards[i][1].reshape(-1) for i in c.members]).tolist()
        row = torch.tensor([c.seat.key, *mine], dtype=torch.int64)
        gathered = [torch.empty_like(row) for _ in range(dist.get_world_size(group))]
        dist.all_gather(gathered, row, group=group)
        table = [g.tolist() for g in gathered]
        return [shards[m][0] for j, m in enumerate(c.members)
                if differing(table, 0, 1 + j)[0]]


def differing(rows: Sequence[Sequence[int]], key_at: int, value_at: int
              ) -> tuple[list[int], bool]:
    """The rows (ranks) whose ``value_at`` differs from the majority of the rows with the same
    nonzero ``key_at`` (a shard's replicas), and whether any group was a tie."""
    groups: dict[int, list[int]] = {}
    for r, row in enumerate(rows):
        if row[key_at]:
            groups.setdefault(row[key_at], []).append(r)
    off: list[int] = []
    tie = False
    for members in groups.values():
        vote = majority([rows[r][value_at] for r in members])
        off += [members[i] for i in vote.differing]
        tie = tie or vote.tie
    return sorted(off), tie
