"""The facts ``harden()`` exchanges for an FSDP2 model, one row of integers per rank, and the
verdict every rank reads from the same rows (``fsdp.guard`` gathers them).

Why integers in one row per rank: the exchange is one SUM allreduce of a ``(world, len(Field))``
int64 block in which each rank wrote only its own row, so every rank receives every row, exactly
(a sum of one value and zeros), and judges the same rows the same way: the same error, naming
the same ranks, is raised on every rank. Digests are 62-bit (a sum never overflows int64).

Invariant: ``judge`` reads nothing but the rows, so its verdict cannot differ between ranks.
"""

from __future__ import annotations

import enum
import hashlib
from collections.abc import Iterable, Sequence

import torch

from openclaw_ref.sync.errors import (
    ClockMismatch,
    ConsistencyError,
    Event,
    GradientsNotAveraged,
    MissingGradient,
    NonFiniteGradient,
    OptimizerMismatch,
    ReplicaDivergence,
)
from openclaw_ref.sync.evidence.vote import plurality

DIGEST_BITS = 62


class Field(enum.IntEnum):
    """The columns of a rank's row."""

    KIND = 0  # an ``Exchange``
    OPT_STEPS = 1  # optimizer steps this rank applied before this exchange
    BACKWARDS = 2  # backwards through the model since harden() (no-sync micro-steps included)
    REDUCED = 3  # digest of (parameter, times its gradient was reduced) since the last step
    NOT_REDUCED = 4  # 1: backwards ran since the last step, yet no gradient was reduced
    NONFINITE = 5  # 1: a NaN/inf in this rank's own gradients, before the reduce-scatter
    OPT_OWNS = 6  # 1: the stepping optimizer holds this model's (sharded) parameters
    HYPER = 7  # digest of the optimizer's hyperparameters (every param group, no tensors)
    REPLICA_OF = 8  # HSDP: 1 + this rank's shard coordinate (its replicas share it); 0: none
    REPLICA = 9  # HSDP: digest of slice (OPT_STEPS mod K) of its local shards, before the step


class Exchange(enum.IntEnum):
    """Where a rank sent its row from. The clock compares it, so a rank that runs one more
    forward/backward than its peers (its peers are at the optimizer step) is named before its
    forward issues FSDP's all-gathers, which would pair with its peers' next step."""

    OPTIMIZER_STEP = 1  # the step's exchange: the optimizer step pre-hook
    EXTRA_FORWARD = 2  # a forward after a reduced backward, with no optimizer step between


def digest(parts: Iterable[str]) -> int:
    """A 62-bit digest of ``parts`` in order."""
    h = hashlib.blake2b(digest_size=8)
    for part in parts:
        h.update(part.encode())
        h.update(b"\x00")
    return int.from_bytes(h.digest(), "big") >> (64 - DIGEST_BITS)


def reduced_digest(names: Sequence[str], counts: Sequence[int]) -> int:
    """Which parameters' gradients were reduced since the last step, and how often."""
    return digest(f"{n}:{c}" for n, c in zip(names, counts) if c)


def _value(v: object) -> str:
    """A hyperparameter's exact text (floats by their bits, so 1e-3 and 1.0000001e-3 differ)."""
    if isinstance(v, torch.Tensor):
        return _value(v.detach().cpu().tolist())
    if isinstance(v, float):
        return v.hex()
    if isinstance(v, (list, tuple)):
        return "(" + ",".join(_value(x) for x in v) + ")"
    return repr(v)


def hyper_digest(optimizer: torch.optim.Optimizer) -> int:
    """Every param group's hyperparameters (lr, betas, weight decay, …; not the parameters):
    under data parallelism they must be equal on every rank, and a rank whose lr differs
    updates its shards differently — silently, in stock FSDP2."""
    return digest(f"{i}|{k}={_value(v)}" for i, group in enumerate(optimizer.param_groups)
                  for k, v in sorted(group.items()) if k != "params")


def judge(rows: list[list[int]], global_ranks: Sequence[int], raise_nonfinite: bool,
          slices: int = 1) -> tuple[ConsistencyError | None, list[Event]]:
    """The verdict of one exchange: the first error (clock, what was reduced, replicas,
    non-finite, optimizer), with the ranks that differ from the plurality named by their global
    rank, and the non-fatal findings (a non-finite gradient under ``nonfinite="skip"``).
    ``slices``: K, the replica digest's slice count (for the message)."""
    def ranks(group_ranks: Iterable[int]) -> list[int]:
        return [global_ranks[r] for r in group_ranks]

    clock = plurality([(r[Field.KIND], r[Field.OPT_STEPS], r[Field.BACKWARDS]) for r in rows])
    step = clock.reference[1]
    if clock.differing:
        told = "; ".join(f"rank {global_ranks[r]}: {_clock_text(rows[r])}"
                         for r in clock.differing)
        others = _clock_text(rows[_first_agreeing(clock, len(rows))])
        return ClockMismatch(f"{told}; the others: {others} (a rank ran another "
                             f"forward/backward or optimizer step?){_no_majority(clock, rows)}",
                             step=step, ranks=ranks(clock.differing)), []
    reduced = plurality([r[Field.REDUCED] for r in rows])
    if reduced.differing:
        return MissingGradient("these ranks reduced other sharded parameters, or as often, "
                               f"since the last optimizer step{_no_majority(reduced, rows)}",
                               step=step,
                               ranks=ranks(reduced.differing)), []
    kind = Exchange(rows[0][Field.KIND])
    if kind is Exchange.OPTIMIZER_STEP:
        diverged = replica_divergence(rows)
        if diverged:
            return ReplicaDivergence(
                f"HSDP replicas of the same shards differ bitwise (slice {step % slices} of "
                f"{slices}, digested before this optimizer step); a rank is named when its "
                "digest differs from the plurality of its replicas, and with two replicas from "
                "the lower rank's: either may be the faulty one", step=step,
                ranks=ranks(diverged)), []
    unreduced = [r for r, row in enumerate(rows) if row[Field.NOT_REDUCED]]
    if kind is Exchange.OPTIMIZER_STEP and unreduced:
        return GradientsNotAveraged("backwards ran since the last optimizer step but FSDP "
                                    "reduced no gradient (set_requires_gradient_sync(False) "
                                    "left on?)", step=step, ranks=ranks(unreduced)), []
    nonfinite = [r for r, row in enumerate(rows) if row[Field.NONFINITE]]
    events: list[Event] = []
    if nonfinite:
        err = NonFiniteGradient("a NaN/inf in these ranks' own gradients, before the "
                                "reduce-scatter", step=step, ranks=ranks(nonfinite))
        if raise_nonfinite:
            return err, []
        events.append(err.event())
    if kind is Exchange.OPTIMIZER_STEP:
        error = _optimizer_verdict(rows, ranks, step)
        if error is not None:
            return error, events
    return None, events


def replica_divergence(rows: list[list[int]]) -> list[int]:
    """The ranks whose replica digest differs from the plurality of the ranks holding the same
    shards (same ``REPLICA_OF``); 1-D FSDP has no replicas, and nothing is compared."""
    peers: dict[int, list[int]] = {}
    for r, row in enumerate(rows):
        if row[Field.REPLICA_OF]:
            peers.setdefault(row[Field.REPLICA_OF], []).append(r)
    off: list[int] = []
    for members in peers.values():
        vote = plurality([rows[r][Field.REPLICA] for r in members])
        off += [members[i] for i in vote.differing]
    return sorted(off)


def _optimizer_verdict(rows: list[list[int]], ranks, step: int) -> ConsistencyError | None:
    foreign = [r for r, row in enumerate(rows) if not row[Field.OPT_OWNS]]
    if foreign:
        return OptimizerMismatch("the stepping optimizer holds none of the model's sharded "
                                 "parameters (built before fully_shard?): the model would "
                                 "never train", step=step, ranks=ranks(foreign))
    hyper = plurality([r[Field.HYPER] for r in rows])
    if hyper.differing:
        return OptimizerMismatch("the optimizer's hyperparameters (lr, betas, weight decay, "
                                 f"…) differ from the other ranks'{_no_majority(hyper, rows)}",
                                 step=step,
                                 ranks=ranks(hyper.differing))
    return None


def _no_majority(vote, rows: Sequence[object]) -> str:
    """The caveat of a tie (``vote``): the ranks named are only those that differ from the
    lowest rank's value, and either side may be the faulty one."""
    if 2 * len(vote.differing) < len(rows):
        return ""
    return "; the ranks disagree, no majority: either side may be the faulty one"


def _first_agreeing(vote, world: int) -> int:
    return next(r for r in range(world) if r not in vote.differing)


def _clock_text(row: list[int]) -> str:
    where = ("at the optimizer step" if row[Field.KIND] == Exchange.OPTIMIZER_STEP
             else "at a forward after a reduced backward")
    return (f"{where} after {row[Field.OPT_STEPS]} optimizer steps and "
            f"{row[Field.BACKWARDS]} backwards")
