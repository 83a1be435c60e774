"""The facts ``harden()`` exchanges for an FSDP2 model, one row of integers per rank, and the
verdict every rank reads from the same rows (``guard`` gathers them).

Why integers in one row per rank: the exchange is one SUM allreduce of a ``(world, len(Field))``
int64 block in which each rank wrote only its own row, so every rank receives every row, exactly
(a sum of one value and zeros), and judges the same rows the same way: the same error, naming
the same ranks, is raised on every rank. Digests are 62-bit (a sum never overflows int64).

After the fixed fields (``Field``) come the replica classes' columns (``replicas``: HSDP's,
``replicate_with_fsdp``'s and tensor parallelism's replicas, one rule).

Invariant: ``judge`` reads nothing but the rows, so its verdict cannot differ between ranks;
the one collective it may start (naming a replica class's parameters) is started on every rank
alike.
"""

from __future__ import annotations

import enum
import hashlib
from collections.abc import Callable, Iterable, Sequence

import torch

from openclaw_ref.sync.errors import (
    CheckpointMismatch,
    ClockMismatch,
    ConsistencyError,
    Event,
    GradientsNotAveraged,
    InputMismatch,
    MissingGradient,
    NonFiniteGradient,
    OptimizerMismatch,
    ScaleMismatch,
)
from openclaw_ref.sync.evidence.vote import majority, tie_caveat
from openclaw_ref.sync.fsdp.replicas import Column, Finding, Replicas, differing
from openclaw_ref.sync.fsdp.scale import FACTOR, factor_text, from_bits, judge_scales

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
    INPUT_OF = 8  # TP: 1 + the lowest rank of this rank's tp group (its peers share it); 0: off
    INPUT = 9  # TP: chained digest of the root's inputs since the last optimizer step
    LOADS = 10  # load_state_dict calls into the model since harden()
    SCALE = 11  # float64 bits: the uniform factor applied to the reduced shards (NaN: none)


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
          slices: int = 1, scale_tol: float = FACTOR, replicas: Replicas | None = None,
          name: Callable[[Finding], list[str]] = lambda finding: []
          ) -> tuple[ConsistencyError | None, list[Event]]:
    """The verdict of one exchange: the first error (clock, loads, what was reduced, replicas,
    non-finite, scale, optimizer), with the ranks that differ from the majority named by their
    global rank (every rank on a tie), and the non-fatal findings
    (a non-finite gradient under ``nonfinite="skip"``). ``slices``: K, the replica digest's
    slice count (for the message); ``scale_tol``: the scale check's relative tolerance
    (``scale.tolerance``); ``replicas``: the guard's replica classes, whose columns follow
    the fixed fields, and ``name`` the parameters of a class that differs (a collective)."""
    def ranks(group_ranks: Iterable[int]) -> list[int]:
        return [global_ranks[r] for r in group_ranks]

    clock = majority([(r[Field.KIND], r[Field.OPT_STEPS], r[Field.BACKWARDS]) for r in rows])
    step = clock.reference[1]
    if clock.differing:
        told = "; ".join(f"rank {global_ranks[r]}: {_clock_text(rows[r])}"
                         for r in clock.differing)
        others = ("" if clock.tie else
                  f"; the others: {_clock_text(rows[_first_agreeing(clock, len(rows))])}")
        return ClockMismatch(f"{told}{others} (a rank ran another "
                             f"forward/backward or optimizer step?){tie_caveat(clock)}",
                             step=step, ranks=ranks(clock.differing)), []
    loaded = _loaders([r[Field.LOADS] for r in rows])
    if loaded:
        counts = ", ".join(f"rank {global_ranks[r]}: {row[Field.LOADS]}"
                           for r, row in enumerate(rows))
        return CheckpointMismatch(f"ranks called load_state_dict on the model a different "
                                  f"number of times since harden() ({counts}): a checkpoint "
                                  "loaded on some ranks only? (named: the ranks that loaded "
                                  "more often than the others)", step=step,
                                  ranks=ranks(loaded)), []
    kind = Exchange(rows[0][Field.KIND])
    reduced = majority([r[Field.REDUCED] for r in rows])
    if reduced.differing:
        return MissingGradient("these ranks reduced other sharded parameters, or as often, "
                               f"since the last optimizer step{tie_caveat(reduced)}",
                               step=step,
                               ranks=ranks(reduced.differing)), []
    if kind is Exchange.OPTIMIZER_STEP:
        error = _replica_verdict(rows, ranks, step, slices, replicas, name, Column.VALUE)
        if error is not None:
            return error, []
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
        factors = [from_bits(r[Field.SCALE]) for r in rows]
        scaled = judge_scales(factors, scale_tol)
        if scaled:
            return ScaleMismatch("ranks scaled their reduced gradient shards by different "
                                 "factors before the optimizer step "
                                 f"({factor_text(factors, global_ranks)}): clipping by each "
                                 "rank's local norm? Clip by the global norm "
                                 "(clip_grad_norm_ on the DTensor gradients)", step=step,
                                 ranks=ranks(scaled)), events
        if not nonfinite:  # NaN bits need not agree; the non-finite verdict stands for them
            error = _replica_verdict(rows, ranks, step, slices, replicas, name, Column.GRAD)
            if error is not None:
                return error, events
        error = _optimizer_verdict(rows, ranks, step)
        if error is not None:
            return error, events
    return None, events


def _loaders(counts: Sequence[int]) -> list[int]:
    """The ranks whose load count differs from the majority's; without a majority (two
    ranks: rank 0 loaded, rank 1 did not) those that loaded more often than the fewest — a
    per-rank fact, not a vote: loading is what a rank did, and the rank that did it is named."""
    vote = majority(list(counts))
    if not vote.tie:
        return list(vote.differing)
    return [r for r, c in enumerate(counts) if c > min(counts)]


def _replica_verdict(rows: list[list[int]], ranks, step: int, slices: int,
                     replicas: Replicas | None, name: Callable[[Finding], list[str]],
                     column: Column) -> ConsistencyError | None:
    """VALUE: the inputs of a tp group, then each replica class's values; GRAD: each class's
    gradients — judged after the scale check, whose verdict names the cause when clipping
    by local norms made them differ."""
    fed, tie = differing(rows, Field.INPUT_OF, Field.INPUT)
    if fed and column is Column.VALUE:
        either = "; two ranks disagree: either may be the one fed wrongly" if tie else ""
        return InputMismatch("the tensor-parallel ranks of one data-parallel group were fed "
                             "different inputs since the last optimizer step, where the plan's "
                             "first module takes its input replicated over tp (a data loader "
                             f"sharded by global rank instead of by data-parallel rank?){either}",
                             step=step, ranks=ranks(fed))
    if replicas is None:
        return None
    findings = [f for f in replicas.findings(rows, len(Field)) if f.column is column]
    if not findings:
        return None
    return replicas.error(findings[0], name(findings[0]), step, ranks(findings[0].ranks),
                          slices)


def _optimizer_verdict(rows: list[list[int]], ranks, step: int) -> ConsistencyError | None:
    foreign = [r for r, row in enumerate(rows) if not row[Field.OPT_OWNS]]
    if foreign:
        return OptimizerMismatch("the stepping optimizer holds none of the model's sharded "
                                 "parameters (built before fully_shard?): the model would "
                                 "never train", step=step, ranks=ranks(foreign))
    hyper = majority([r[Field.HYPER] for r in rows])
    if hyper.differing:
        return OptimizerMismatch("the optimizer's hyperparameters (lr, betas, weight decay, "
                                 f"…) differ from the other ranks'{tie_caveat(hyper)}",
                                 step=step,
                                 ranks=ranks(hyper.differing))
    return None


def _first_agreeing(vote, world: int) -> int:
    """A rank holding the reference value (rank 0 on a tie, where every rank is a suspect)."""
    return next((r for r in range(world) if r not in vote.differing), 0)


def _clock_text(row: list[int]) -> str:
    where = {Exchange.OPTIMIZER_STEP: "at the optimizer step",
             Exchange.EXTRA_FORWARD: "at a forward after a reduced backward",
             }.get(row[Field.KIND], f"at exchange kind {row[Field.KIND]}")
    return (f"{where} after {row[Field.OPT_STEPS]} optimizer steps and "
            f"{row[Field.BACKWARDS]} backwards")
