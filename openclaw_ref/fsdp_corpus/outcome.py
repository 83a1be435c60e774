"""What a corpus run ended in, judged only from what each rank wrote about itself.

Every rank writes one ``RankResult`` per pattern into a shared directory (atomically), whatever
happens to it: it finished (with its digest of the full parameters), a check named the fault,
it raised, or its watchdog fired. A rank killed by a signal (gloo aborts on a collective size
mismatch) writes nothing. ``classify`` turns the ranks' results into one ``Outcome``; rank 0
calls it when every rank reported, the launcher calls it for what rank 0 could not report.

Invariant: a rank that only saw its peer vanish ("Connection reset by peer") is never the
cause while another rank's own failure is known.
"""

from __future__ import annotations

import enum
import os
import re
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from openclaw_ref.core.jsonio import read_json, write_json_atomic

PEER_GONE = ("Connection reset by peer", "Connection closed by peer", "Broken pipe")
TIMED_OUT = ("Timed out", "timed out")
REPLICAS_DIFFER = "replicas differ after gathering full tensors"


class Status(enum.StrEnum):
    FINISHED = "finished"
    DETECTED = "detected"
    ERROR = "error"
    WATCHDOG = "watchdog"  # the rank's own deadline passed: it was still waiting


class Kind(enum.StrEnum):
    DETECTED = "detected"
    SILENT = "silent-corruption"
    CRASH = "crash"
    HANG = "hang-timeout"
    NO_EFFECT = "no-effect"


@dataclass
class RankResult:
    """One rank's account of one pattern. ``step``: the training step it was in when it stopped
    (the step count when it finished); ``error``: "ExceptionType: first line"; ``warnings``: the
    warnings it printed (a script that records them, the TP corpus's)."""

    rank: int
    pattern: str
    status: Status
    step: int
    digest: str | None = None
    max_abs_diff: float | None = None  # from the reference run's full parameters
    error: str | None = None
    detection: dict | None = None
    warnings: list[str] = field(default_factory=list)  # "Category: message", as printed

    @classmethod
    def from_json(cls, obj: dict) -> RankResult:
        return cls(**{**obj, "status": Status(obj["status"])})


@dataclass
class Outcome:
    """The run's verdict: ``ranks`` are the ranks it names (the detection's, those that failed
    first, or those that timed out); ``step`` the earliest step a failing rank was in;
    ``error`` what it ended in, as an identifier (``error_class``): the check's exception class
    (detected), or how the first named rank stopped (crash, hang); None otherwise."""

    pattern: str
    kind: Kind
    ranks: list[int] = field(default_factory=list)
    step: int | None = None
    detail: str = ""
    max_abs_diff: float | None = None  # largest |Δparam| from the reference, over ranks
    per_rank: dict[int, str] = field(default_factory=dict)
    error: str | None = None
    # detected while other ranks failed in the backend instead (gloo aborted one, or it timed
    # out where no check runs): how the first of them stopped, and which ranks failed
    failed_error: str | None = None
    failed_ranks: list[int] = field(default_factory=list)

    def to_json(self) -> dict:
        return {**asdict(self), "kind": self.kind.value}


def result_path(out_dir: Path, pattern: str, rank: int) -> Path:
    return out_dir / f"{pattern}.rank{rank}.json"


def step_path(out_dir: Path, pattern: str, rank: int) -> Path:
    return out_dir / f"{pattern}.rank{rank}.step"


def read_step(out_dir: Path, pattern: str, rank: int) -> int | None:
    """The step rank ``rank`` last entered in ``pattern``'s run (None: unknown)."""
    try:
        return int(step_path(out_dir, pattern, rank).read_text())
    except (OSError, ValueError):
        return None


def write_result(out_dir: Path, result: RankResult) -> None:
    write_json_atomic(result_path(out_dir, result.pattern, result.rank),
                      {**asdict(result), "status": result.status.value})


def read_results(out_dir: Path, pattern: str, world_size: int) -> dict[int, RankResult | None]:
    """Every rank's result for ``pattern``; None for a rank that wrote none."""
    out: dict[int, RankResult | None] = {}
    for rank in range(world_size):
        path = result_path(out_dir, pattern, rank)
        out[rank] = RankResult.from_json(read_json(path)) if path.exists() else None
    return out


def wait_for_results(out_dir: Path, pattern: str, world_size: int,
                     deadline_s: float) -> dict[int, RankResult | None]:
    """The ranks' results once all are written or ``deadline_s`` has passed (a rank killed by
    a signal never writes; the launcher then ends this process)."""
    end = time.monotonic() + deadline_s
    while True:
        results = read_results(out_dir, pattern, world_size)
        if all(r is not None for r in results.values()) or time.monotonic() >= end:
            return results
        time.sleep(0.05)  # polling a directory for files other processes write


def process_group_intact(results: dict[int, RankResult | None]) -> bool:
    """Every rank left the run normally (finished, or a check stopped it on every rank's
    agreement, not after a failed collective): the next run may use the same process group."""
    return all(r is not None and (r.status is Status.FINISHED or r.status is Status.DETECTED
                                  and not (r.detection or {}).get("collective_failed"))
               for r in results.values())


def _is(error: str | None, needles: tuple[str, ...]) -> bool:
    return error is not None and any(n in error for n in needles)


def _account(res: RankResult) -> str:
    return res.status.value if res.error is None else f"{res.status.value}: {res.error}"


_SIGNAL = re.compile(r"died by (SIG\w+)")
_EXIT = re.compile(r"exited with code (-?\d+)")
_EXCEPTION = re.compile(r"^([A-Za-z_][\w.]*)\s*:")


def error_class(result: RankResult | None, lost: str | None, deadline_hit: bool) -> str:
    """How one rank stopped, as an identifier: the exception type it raised (``RuntimeError``
    for gloo's timeout), ``watchdog`` (its own deadline), the signal that killed it
    (``SIGABRT``), ``exit N``, or with no account ``deadline`` (the launcher killed it at the
    job's deadline) / ``died``."""
    if result is not None:
        if result.status is Status.WATCHDOG:
            return "watchdog"
        m = _EXCEPTION.match(result.error or "")
        return m.group(1) if m else result.status.value
    if lost is not None and (m := _SIGNAL.search(lost) or _EXIT.search(lost)):
        return m.group(1) if m.re is _SIGNAL else f"exit {m.group(1)}"
    return "deadline" if deadline_hit else "died"


def classify(pattern: str, results: dict[int, RankResult | None], reference: str | None, *,
             deadline_hit: bool = False, lost: dict[int, str] | None = None,
             lost_steps: dict[int, int | None] | None = None,
             terminated: frozenset[int] = frozenset()) -> Outcome:
    """One verdict from the ranks' own results. ``reference``: the digest of the same script
    run without the mistake. ``deadline_hit``: the launcher killed the run at its deadline, so a
    rank that wrote nothing was still waiting; otherwise it died without reporting, and
    ``lost`` may say how (the launcher's account of its exit, e.g. a signal) and
    ``lost_steps`` the step it was in. ``terminated``: ranks the launcher itself ended after
    another rank failed (torchrun's SIGTERM), never a cause while another is known."""
    lost_steps = {r: s for r, s in (lost_steps or {}).items()
                  if s is not None and results.get(r) is None}
    gone = "no result (killed by the launcher)" if deadline_hit else "no result (died)"
    per_rank = {r: _account(res) if res is not None else
                (lost or {}).get(r, gone)
                + (f" (in step {lost_steps[r]})" if r in lost_steps else "")
                for r, res in results.items()}
    out = Outcome(pattern, Kind.NO_EFFECT, per_rank=per_rank)
    reported = {r: res for r, res in results.items() if res is not None}
    stopped = [res.step for res in reported.values() if res.status is not Status.FINISHED]
    stopped += list(lost_steps.values())
    out.step = min(stopped) if stopped else None
    detections = [res for res in reported.values() if res.status is Status.DETECTED]
    failure = _failure(results, deadline_hit, terminated)
    failed_error = None if failure is None else error_class(
        results.get(failure[1][0]), (lost or {}).get(failure[1][0]), deadline_hit)
    if detections:
        first = detections[0].detection or {}
        out.kind, out.ranks = Kind.DETECTED, list(first.get("ranks", []))
        out.error = first.get("kind")
        out.step, out.detail = first.get("step"), str(first.get("detail", ""))[:300]
        if failure is not None:
            out.failed_ranks, out.failed_error = failure[1], failed_error
        return out
    if failure is not None:
        out.kind, out.ranks = failure
        out.detail = "; ".join(f"rank {r}: {per_rank[r]}" for r in out.ranks)[:600]
        out.error = failed_error
        return out
    diffs = [res.max_abs_diff for res in reported.values() if res.max_abs_diff is not None]
    out.max_abs_diff = max(diffs) if diffs else None
    digests = {res.digest for res in reported.values()}
    if len(digests) > 1:
        out.kind, out.detail = Kind.SILENT, REPLICAS_DIFFER
    elif reference is not None and digests != {reference}:
        out.kind, out.detail = Kind.SILENT, "the result differs from the run without the mistake"
    return out


def _failure(results: dict[int, RankResult | None], deadline_hit: bool,
             terminated: frozenset[int]) -> tuple[Kind, list[int]] | None:
    """Crash or hang and the ranks to name, or None when every rank left the run normally.
    First failures (a rank that died on its own, or raised anything but a timeout or a
    vanished peer) outrank timeouts, which outrank ranks that only saw a peer go."""
    reported = {r: res for r, res in results.items() if res is not None}
    errors = {r: res.error for r, res in reported.items() if res.status is Status.ERROR}
    silent = sorted(r for r, res in results.items() if res is None and r not in terminated)
    ended = sorted(r for r, res in results.items() if res is None and r in terminated)
    timed_out = {r for r, e in errors.items() if _is(e, TIMED_OUT)}
    timed_out |= {r for r, res in reported.items() if res.status is Status.WATCHDOG}
    peer = sorted(r for r, e in errors.items() if _is(e, PEER_GONE) and r not in timed_out)
    raised = sorted(set(errors) - timed_out - set(peer))
    if deadline_hit:  # the launcher stopped ranks that were still waiting
        timed_out |= set(silent) | set(ended)
        silent, ended = [], []
    if silent or raised:
        return Kind.CRASH, sorted(set(silent) | set(raised))
    if timed_out:
        return Kind.HANG, sorted(timed_out)
    if peer or ended:
        return Kind.CRASH, peer or ended
    return None


def default_out_dir() -> Path:
    """A directory every rank of one torchrun job agrees on without talking: named after the
    job's run id (``--standalone`` makes a fresh one per job)."""
    run_id = os.environ.get("TORCHELASTIC_RUN_ID", "none")
    return Path(os.environ.get("TMPDIR", "/tmp")) / f"openclaw-fsdp-corpus-{run_id}"
