"""What the compute canary (``canary``) sends, keeps and says, apart from its schedule: a rank's
row status and how a probe's runs are encoded for the confirmation gather, the canary's modes,
event kinds and the words it turns itself off with, and the step row's digests — the replica
slices', then the canary's — as the step guard's failure gather reads them."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from openclaw_ref.sync.canary.probe import ProbeResult
from openclaw_ref.sync.canary.verdict import Run
from openclaw_ref.sync.errors import ConsistencyError
from openclaw_ref.sync.evidence.replica_digest import ReplicaDigest, mix_int
from openclaw_ref.sync.evidence.replica_slices import ReplicaSlices

NONE, PROBED, UNBUILT = range(3)  # a rank's row status
HEAD = 4  # status, capture step, owner, probe index
STRIKES = 3  # one-offs beyond the tolerance on one rank, none elsewhere, that raise
WIDEN = 10.0  # the tolerance's factor when the job's noise exceeds it on several ranks
SEED0 = 0x0C1A5
_MASK64 = (1 << 64) - 1


# why the canary turns itself off (``Canary._off``), the same words on every rank
FORWARD_REPLACED = ("the module's forward is not the one it had at hardening (Lightning "
                    "replaces it with training_step for each call), which the probe cannot run "
                    "without the step's side effects")
UNPROBED = ("could not run the probe on the shared input (its call's arguments have another "
            "structure there, or the probe raised: that rank's warning says what)")
OTHER_PATHS = ("the ranks' forwards took different paths on the same probe input (other "
               "parameters got a gradient): the forward depends on rank-local code or state, "
               "such as a per-rank attribute choosing a branch, which the probe cannot replay")


class CanaryEvent(enum.StrEnum):
    UNREPRODUCIBLE = "CanaryUnreproducible"  # bitwise no longer holds: the tolerance now
    TRANSIENT = "CanaryTransient"  # a one-off result on one rank
    UNAVAILABLE = "CanaryUnavailable"  # the canary is off


class Mode(enum.StrEnum):
    BITWISE = "bitwise"
    TOLERANCE = "tolerance"
    OFF = "off"


@dataclass
class ProbeCall:
    """What a probe ran on, kept until its compare so that it can be re-run exactly: the
    input, the seed, and the buffers as they were (the step's forward updates BatchNorm's)."""

    args: tuple
    kwargs: dict
    seed: int
    buffers: dict[str, torch.Tensor]


PROBED_FLAG, LOW_FLAG = 1, 2  # a gathered row's flags


def flag(run: ProbeResult) -> int:
    return PROBED_FLAG | (LOW_FLAG if run.low_precision else 0)


def encode(runs: Sequence[ProbeResult]) -> torch.Tensor:
    """One int64 row: the flags, then each run's digests and its figures' bits."""
    parts = [torch.tensor([flag(runs[0])], dtype=torch.int64)]
    for run in runs:
        parts.append(torch.as_tensor(run.digest_list(), dtype=torch.int64).reshape(-1))
        parts.append(run.figures.detach().to("cpu", torch.float64).view(torch.int64))
    return torch.cat(parts)


def decode(row: Sequence[int], params: int) -> list[Run]:
    out, at = [], 1
    while at < len(row):
        digests = tuple(row[at:at + params])
        bits = torch.tensor(row[at + params:at + 3 * params], dtype=torch.int64)
        out.append(Run(digests, tuple(bits.view(torch.float64).tolist())))
        at += 3 * params
    return out


def marked(run: ProbeResult | None, status: int) -> int | torch.Tensor:
    """The combined digest of a probe's ``run`` (0 without one), moved by a fixed mark when
    the probe did not run cleanly, so that a rank that could not probe disagrees with one
    that did: what is folded into the step row, bitwise."""
    digests = run.digests if run is not None else []
    combined = (ReplicaDigest.combine_on_host(digests) if isinstance(digests, list)
                else ReplicaDigest.combine(digests) if digests.numel() else 0)
    if status == PROBED:
        return combined
    mark = mix_int(status) & _MASK64
    mark = mark - (1 << 64) if mark >> 63 else mark
    return combined ^ mark


def folded(replica: int | torch.Tensor | None, pending: int | torch.Tensor,
           device: torch.device) -> int | torch.Tensor:
    """The step row's digest ``replica`` (None: none) with a probe's ``pending`` XORed in: on
    the host where both are host integers, else on ``device``."""
    if replica is None:
        return pending
    if isinstance(replica, int) and isinstance(pending, int):
        return replica ^ pending
    return torch.as_tensor(replica, device=device) ^ torch.as_tensor(pending, device=device)


def by_global_rank(global_ranks: Sequence[int], **counts: dict[int, int]
                   ) -> dict[str, dict[str, int]]:
    """Each of ``counts`` (group rank → count) keyed by global rank, as the summary's JSON
    has it."""
    return {key: {str(global_ranks[r]): n for r, n in per_rank.items()}
            for key, per_rank in counts.items()}


class RowDigests(Protocol):
    """What rides in the step row and is compared by the failure gather (``ReplicaSlices``,
    ``canary.Canary``)."""

    def gather_row(self) -> list[int]: ...

    def divergence(self, rows: Sequence[Sequence[int]], active: Sequence[int], *,
                   step: int) -> ConsistencyError | None: ...

    def summary(self) -> dict: ...


def canary_summary(canary: RowDigests | None, off: str) -> dict:
    """A guard's ``summary()['canary']``: the canary's own, or why there is none (``off``:
    ``hardening.canary_interval``'s reason)."""
    if canary is not None:
        return canary.summary()
    return {"every": 0, "mode": Mode.OFF.value, "why": off or "off", "probes": 0}


class StepDigests:
    """What rides in the step row, for the failure gather: the replica slices' row, then the
    canary's; a divergence is the replicas' first, else the canary's."""

    def __init__(self, replicas: ReplicaSlices, canary: RowDigests) -> None:
        self.replicas, self.canary = replicas, canary

    def gather_row(self) -> list[int]:
        return self.replicas.gather_row() + self.canary.gather_row()

    def divergence(self, rows: Sequence[Sequence[int]], active: Sequence[int], *,
                   step: int) -> ConsistencyError | None:
        cut = 1 + self.replicas.width
        return (self.replicas.divergence([r[:cut] for r in rows], active, step=step)
                or self.canary.divergence([r[cut:] for r in rows], active, step=step))


def step_digests(replicas: ReplicaSlices, canary: RowDigests | None
                 ) -> ReplicaSlices | StepDigests:
    """The step row's digests: the replica slices alone, or with the canary's."""
    return replicas if canary is None else StepDigests(replicas, canary)
