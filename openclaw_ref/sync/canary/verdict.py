"""What a confirmed probe mismatch means: persistent, transient on one rank, or the job's own
non-determinism — decided from the same gathered runs on every rank, so every rank reaches the
same verdict.

A mismatch is a suspicion. Before any verdict every rank re-runs the very probe — the same
input, parameters, buffers, seed and cotangent — ``RERUNS`` more times, and the runs of every
rank are gathered (``canary``). Then, with "the same" meaning bitwise equal digests, or under
the tolerance figures within ``RTOL`` (``canary.tolerance``):

- a rank **varies** when its own runs are not all the same;
- two or more ranks vary → ``NONDETERMINISTIC``: the job's kernels do not reproduce (GPU
  atomics, reduction order). Honest; never raised;
- the ranks that do not vary disagree, and not even on which parameters got a gradient →
  ``PATHS``: their forwards took different paths on the same input — rank-dependent code or
  state (a per-rank attribute choosing a branch), which the probe cannot replay: no verdict;
- the ranks that do not vary disagree → ``PERSISTENT``: each reproduces its own result, so the
  difference is in the ranks, not in the runs — the suspects are those the majority vote of
  the stable ranks singles out, every stable rank on a tie (``vote``);
- exactly one rank varies and the others agree → ``TRANSIENT`` on that rank (attributed by its
  own variation, a per-rank fact: also with two ranks), with its distance from the others;
- otherwise ``AGREE``.

Why honest non-determinism cannot be called persistent: a noisy kernel gives a rank other bits
on other runs, so that rank varies; to be stable AND differ, a rank would have to reproduce the
same wrong bits three times — which is what a defect does, and noise does not.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

from openclaw_ref.sync.canary.tolerance import distance, first_apart, off_ranks
from openclaw_ref.sync.errors import ComputeMismatch
from openclaw_ref.sync.evidence.vote import TIE_WORDS, Vote, majority, suspects_of

RERUNS = 2  # runs of the same probe after the one that mismatched: three runs in all


class Outcome(enum.StrEnum):
    AGREE = "agree"
    PERSISTENT = "persistent"
    PATHS = "different paths"
    TRANSIENT = "transient"
    NONDETERMINISTIC = "non-deterministic"


@dataclass(frozen=True)
class Run:
    """One run of a probe on one rank: a digest per parameter, and its figures."""

    digests: tuple[int, ...]
    figures: tuple[float, ...]


@dataclass(frozen=True)
class Finding:
    """The verdict over the ranks' runs: ``ranks`` are indices into the runs given (the
    suspects, or the ranks that varied); ``tie``: no strict majority among the stable ranks;
    ``param``: the first parameter index that differs; ``distance``: how far the suspects'
    results are from the others' (``canary.tolerance.distance``)."""

    outcome: Outcome
    ranks: tuple[int, ...] = ()
    tie: bool = False
    param: int | None = None
    distance: float = 0.0


def classify(runs: Sequence[Sequence[Run]], tolerant: bool, rtol: float) -> Finding:
    """The finding over ``runs`` (per rank, its runs in order; module docstring)."""
    def same(a: Run, b: Run) -> bool:
        return distance(a.figures, b.figures) <= rtol if tolerant else a.digests == b.digests

    varies = [i for i, rr in enumerate(runs) if not all(same(rr[0], x) for x in rr[1:])]
    stable = [i for i in range(len(runs)) if i not in varies]
    if len(varies) >= 2:
        return Finding(Outcome.NONDETERMINISTIC, tuple(varies),
                       distance=max(_spread(runs[i]) for i in varies))
    firsts = [runs[i][0] for i in stable]
    vote = _vote(firsts, tolerant, rtol) if firsts else Vote(None, [], False)
    if vote.differing and len({_present(r) for r in firsts}) > 1:
        return Finding(Outcome.PATHS, tuple(stable))
    if vote.differing:
        suspects = [stable[i] for i in vote.differing]
        ref = _reference(firsts, vote)
        far = max(distance(runs[i][0].figures, ref.figures) for i in suspects)
        return Finding(Outcome.PERSISTENT, tuple(suspects), vote.tie,
                       _first_param(runs[suspects[0]][0], ref, suspects, runs, tolerant, rtol),
                       far)
    if varies:
        v = varies[0]
        if not firsts:
            return Finding(Outcome.TRANSIENT, (v,), distance=_spread(runs[v]))
        ref = firsts[0]
        odd = max(runs[v], key=lambda run: distance(run.figures, ref.figures))
        return Finding(Outcome.TRANSIENT, (v,), param=_differs_at(odd, ref, tolerant, rtol),
                       distance=distance(odd.figures, ref.figures))
    return Finding(Outcome.AGREE)


def mismatch_error(finding: Finding, step: int, head: Sequence[int], name: str,
                   tolerant: bool, intermittent: int = 0) -> ComputeMismatch:
    """The error of a confirmed ``finding`` at ``step``: the probe (``head``: status, capture
    step, owner, probe index), the first differing parameter ``name``, and what to do — with
    no majority (``finding.tie``), every suspect named, and how to tell them apart.
    ``intermittent``: the strikes of a rank whose one-offs added up."""
    how = ("beyond the tolerance" if tolerant else "bitwise")
    probe = (f"probe {head[3]}: rank {head[2]}'s input slice of step {head[1]}, the same "
             "parameters, buffers, dropout seed and cotangent on every rank")
    what = (f"gave one-off results beyond the tolerance on {intermittent} probes (the last, "
            f"{probe}), and no other rank's results ever varied: its hardware computes "
            "wrong intermittently" if intermittent else
            f"computed other gradients than the others ({how}) from the same probe and "
            f"reproduced them on {1 + RERUNS} runs ({probe})")
    advice = (f"the ranks split with {TIE_WORDS} — rerun the job with these ranks on other "
              "hardware, or with a third rank, to tell which" if finding.tie else
              "drain the named node and rerun the job on other hardware")
    return ComputeMismatch(
        f"{what}: first differing parameter {name}, {finding.distance:.3g} of the probe "
        f"gradient's mass; {advice}", step=step, ranks=list(finding.ranks), params=[name])


def _present(run: Run) -> tuple[bool, ...]:
    """Which parameters got a probe gradient (a digest of 0, or figures of 0 and 0: none)."""
    return tuple(d != 0 or run.figures[2 * j] != 0 or run.figures[2 * j + 1] != 0
                 for j, d in enumerate(run.digests))


def _vote(firsts: list[Run], tolerant: bool, rtol: float) -> Vote:
    if tolerant:
        return suspects_of(off_ranks([r.figures for r in firsts], rtol), len(firsts))
    return majority([r.digests for r in firsts])


def _reference(firsts: list[Run], vote: Vote) -> Run:
    """A run of the majority (on a tie: rank 0's among the stable ranks)."""
    keep = [i for i in range(len(firsts)) if i not in set(vote.differing)]
    return firsts[keep[0] if keep else 0]


def _first_param(run: Run, ref: Run, suspects: list[int], runs, tolerant: bool,
                 rtol: float) -> int | None:
    if run is ref and len(suspects) > 1:  # a tie: compare the first two suspects
        ref = runs[suspects[1]][0]
    return _differs_at(run, ref, tolerant, rtol)


def _differs_at(run: Run, ref: Run, tolerant: bool, rtol: float) -> int | None:
    if tolerant:
        return first_apart(run.figures, ref.figures, rtol)
    return next((j for j, (a, b) in enumerate(zip(run.digests, ref.digests)) if a != b), None)


def _spread(rr: Sequence[Run]) -> float:
    return max(distance(rr[0].figures, x.figures) for x in rr[1:]) if len(rr) > 1 else 0.0
