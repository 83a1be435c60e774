"""The compute canary of ``harden()``'s step guard: every K steps (``SyncConfig.canary_every``)
every rank runs the same small probe (``canary_probe``) and the digest of its gradients rides in
the step's exchange, folded into the replica digest's bits — no byte more on the wire. A rank
whose hardware computes wrong (silent data corruption in a matmul, a mercurial core) makes its
probe differ from the others', and the one plurality vote (``vote.plurality``) names it:
``ComputeMismatch`` on every rank, before the optimizer applies the step. Everything else the
guard checks shows *agreement*; an SDC'd contribution is averaged in, every rank receives the
same wrong gradient and every agreement check passes — this one compares *computation*.

The schedule (capture step c = n·K, n = 0, 1, …; owner = n mod W):
  1. the forward of step c: every rank notes its call's input (``canary_probe.capture``: a
     slice of ``PROBE_ROWS`` rows; the tree of its call);
  2. the settle of step c, once its verdict passed on every rank — every rank read the same
     reduced block, so every rank is here, at the same step: the owner's slice is broadcast
     (``canary_probe.share``: a fixed-size header, then its bytes — the only collectives the
     canary adds, two per K steps). Never while ``DDP.join()`` is active (a joined rank runs no
     settle);
  3. the next forward with gradients enabled (step c + 1): before the module's forward (after
     DDP's buffer broadcast), every rank runs the probe on the current parameters — equal on
     every rank, the replica check proves it — with the owner's slice, the seed of probe n and a
     cotangent from a fixed generator; its per-parameter gradient digests are kept;
  4. the exchange of that step XORs the combined digest into the replica digest's 64 bits (the
     digest alone when replica slices are off); the counts disagree iff some rank's probe
     differs (or the replica slices do); every rank then gathers the per-rank rows — the
     replica pieces and this canary's row — and names the outlier (W ≥ 3), or at W = 2 says the
     two ranks differ and either may be the faulty one (``control.split_view``).
A fault present at step t is therefore named by step t + K + 1 at the latest.

Start-up self-test. The first probe (n = 0) runs twice on every rank: a rank whose two runs
differ (non-deterministic kernels) or a first probe that differs across ranks (ranks with other
thread counts, CPUs or devices — or a fault already present) cannot be told from SDC by a
bitwise comparison; every rank reads the same gathered rows and switches together to the
tolerance of ``canary_tolerance`` (one gather per probe, in the settle of the step after it),
with a ``CanaryUnreproducible`` event and a warning naming the ranks and saying what is no
longer seen. A probe some rank could not build (its call's tree differs from the owner's) is a
``CanaryUnavailable`` event, and the canary goes off on every rank.

What it cannot see: a fault that spares the probe (an op the probe does not run, data the
probe's slice does not reach, an intermittent fault between probes — the detection rate of an
intermittent fault is about its rate per probe, not per step), a fault present on every rank
alike, and, under the tolerance, an error below it (a 1-ulp error).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from openclaw_ref.sync.errors import ComputeMismatch, ConsistencyError, Event
from openclaw_ref.sync.evidence import checks
from openclaw_ref.sync.evidence.canary_probe import (
    ProbeInput,
    capture,
    rebuild,
    run_probe,
    share,
)
from openclaw_ref.sync.evidence.canary_tolerance import RTOL, fingerprints, not_probed, outliers
from openclaw_ref.sync.evidence.control import split_view
from openclaw_ref.sync.evidence.replica_digest import ReplicaDigest, mix_int
from openclaw_ref.sync.evidence.replica_slices import ReplicaSlices
from openclaw_ref.sync.evidence.vote import plurality

NONE, PROBED, UNBUILT, UNREPRODUCIBLE = range(4)  # a rank's row status
UNREPRODUCIBLE_EVENT = "CanaryUnreproducible"
UNAVAILABLE_EVENT = "CanaryUnavailable"
HEAD = 4  # status, capture step, owner, probe index
_SEED0 = 0x0C1A5
_MASK64 = (1 << 64) - 1


class Canary:
    """The canary of one step guard (module docstring). Reads the guard's ``clock``,
    ``module``, ``tracked``, ``group``, ``rank``, ``world_size``, ``ddp`` and ``events``."""

    def __init__(self, guard: Any, every: int) -> None:
        self.guard = guard
        self.every = every
        self.on = True
        self.tolerant = False  # after the start-up self-test: ``canary_tolerance``
        self.probing = False
        self.digest = ReplicaDigest()
        self.device = guard.tracked[0][1].device if guard.tracked else torch.device("cpu")
        self.probes = 0  # probes run so far (the same count on every rank)
        self._noted: ProbeInput | None = None  # this rank's input at the capture step
        self._noted_at = -1
        self._input: tuple | None = None  # the shared probe input, awaiting the next forward
        self._unbuilt = False
        self._head = [NONE, 0, 0, 0]  # of the probe awaiting the exchange, then the sent one
        self._digests: list[int] | torch.Tensor | None = None
        self._pending: int | torch.Tensor | None = None
        self._figures: torch.Tensor | None = None  # tolerant: the last probe's fingerprints
        self._compare_at = -1  # tolerant: the step whose settle compares them
        self._failure = ""  # why this rank's probe raised, if it did
        self._forward: Any = None  # the instance's own forward at hardening, if it had one

    def install(self) -> Any:
        """The forward pre-hook (with the call's keyword arguments) that notes and probes. A
        forward the instance already carries at hardening (Accelerate's mixed-precision
        wrapper: autocast, outputs to fp32) is what every call runs, so the probe runs it too."""
        self._forward = self.guard.module.__dict__.get("forward")
        return self.guard.module.register_forward_pre_hook(self._before_forward,
                                                          with_kwargs=True)

    # -- 1 and 3: the forward ------------------------------------------------------------------
    def _before_forward(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        if self.probing or not self.on or not torch.is_grad_enabled():
            return
        if module.__dict__.get("forward") is not self._forward:  # patched for this call alone
            self._failure = ("the module's forward is not the one it had at hardening "
                             "(Lightning replaces it with training_step for each call), which "
                             "the probe cannot run without the step's side effects")
            self._off(self.guard.clock, list(range(self.guard.world_size)))
            return
        if self._input is not None or self._unbuilt:
            self._probe()
        clock = self.guard.clock
        if clock % self.every == 0 and self._noted_at != clock:
            self._noted, self._noted_at = capture(args, kwargs), clock

    def _probe(self) -> None:
        if self.tolerant:
            self._figures = None if self._unbuilt else fingerprints(
                self._grads(*self._input), _wire_device(self.guard.group, self.device))
            self._input, self._unbuilt = None, False
            self.probes += 1
            return
        status = UNBUILT if self._unbuilt else PROBED
        digests: list[int] | torch.Tensor = []
        if status == PROBED:
            args, kwargs = self._input
            try:
                digests = self._digest(args, kwargs)
                if self.probes == 0 and not _same(digests, self._digest(args, kwargs)):
                    status = UNREPRODUCIBLE
            except Exception as exc:  # a probe must never end a healthy job
                status, digests = UNBUILT, []
                self._failure = f"{type(exc).__name__}: {exc}"
        self._input, self._unbuilt = None, False
        self._head[0], self._head[3] = status, self.probes
        self.probes += 1
        self._digests = digests
        combined = (ReplicaDigest.combine_on_host(digests) if isinstance(digests, list)
                    else ReplicaDigest.combine(digests) if digests.numel() else 0)
        self._pending = _marked(combined, status)
        if self._failure:  # this rank stops after this step's fold (the others learn it there)
            self._off(self._head[1], [self.guard.rank])

    def _grads(self, args: tuple, kwargs: dict) -> list[torch.Tensor | None]:
        self.probing = True
        try:
            return run_probe(self.guard.module, self.guard.tracked, args, kwargs,
                             _SEED0 + self.probes, forward=self._forward)
        finally:
            self.probing = False

    def _digest(self, args: tuple, kwargs: dict) -> list[int] | torch.Tensor:
        """Every tracked parameter's probe-gradient digest (0 where it got none)."""
        grads = self._grads(args, kwargs)
        present = [g for g in grads if g is not None]
        if self.device.type == "cpu":
            got = iter(self.digest.digests_on_host(present))
            return [next(got) if g is not None else 0 for g in grads]
        out = torch.zeros(len(grads), dtype=torch.int64, device=self.device)
        if present:
            at = torch.tensor([i for i, g in enumerate(grads) if g is not None],
                              device=self.device)
            out[at] = self.digest.digests(present)
        return out

    # -- 2: the settle of a capture step --------------------------------------------------------
    def settled(self, step: int) -> None:
        """Step ``step`` passed on every rank: after a tolerant probe, compare its figures; at a
        capture step, share the owner's slice."""
        if self.on and self.tolerant and step == self._compare_at:
            self._compare_within_tolerance(step)
        if not self.on or step % self.every or _joining(self.guard.ddp):
            return
        owner = (step // self.every) % self.guard.world_size
        noted = self._noted if self._noted_at == step else None
        self._noted, self._noted_at = None, -1
        shared = share(noted, owner, self.guard.group, _wire_device(self.guard.group,
                                                                    self.device))
        if shared is None:
            return
        self._input = rebuild(noted if noted is not None else None, shared, self.device)
        self._unbuilt = self._input is None
        self._head[1], self._head[2] = step, owner
        self._compare_at = step + 1

    def _compare_within_tolerance(self, step: int) -> None:
        """Every rank's fingerprints of the probe, gathered; ``ComputeMismatch`` naming those
        beyond ``canary_tolerance.RTOL`` (module docstring of ``canary_tolerance``)."""
        device = _wire_device(self.guard.group, self.device)
        mine = self._figures if self._figures is not None else not_probed(
            len(self.guard.tracked), device)
        self._figures = None
        rows = checks._gather_rows(mine, self.guard.group).tolist()
        off, first = outliers(rows)
        if not off:
            return
        name = self.guard.tracked[first][0] if first is not None else "?"
        raise ComputeMismatch(
            f"the ranks computed different gradients from the same probe, beyond the tolerance "
            f"(rank {self._head[2]}'s input slice of step {self._head[1]}; the start-up "
            f"self-test found the ranks not bitwise reproducible, so probes are compared within "
            f"{RTOL:g} of each gradient's mass): first parameter off {name}"
            + ("; with two ranks either side may be the faulty one" if len(rows) == 2 else "")
            + "; drain the named node and rerun the job on other hardware",
            step=step, ranks=off, params=[name]).renumbered(self.guard.global_ranks)

    # -- 4: the exchange ------------------------------------------------------------------------
    def fold(self, replica: int | torch.Tensor | None) -> int | torch.Tensor | None:
        """The step row's digest with this step's probe folded in (unchanged without one)."""
        pending, self._pending = self._pending, None
        if pending is None:
            self._head[0] = NONE
            return replica
        if replica is None:
            return pending
        if isinstance(replica, int) and isinstance(pending, int):
            return replica ^ pending
        return torch.as_tensor(replica, device=self.device) ^ torch.as_tensor(
            pending, device=self.device)

    def gather_row(self) -> list[int]:
        """This rank's part of the failure gather: the head, then one digest per parameter."""
        n = len(self.guard.tracked)
        if self._head[0] == NONE or self._digests is None:
            return [NONE, 0, 0, 0] + [0] * n
        mine = self._digests if isinstance(self._digests, list) else self._digests.tolist()
        return list(self._head) + (list(mine) + [0] * n)[:n]

    @property
    def width(self) -> int:
        return HEAD + len(self.guard.tracked)

    def divergence(self, rows: Sequence[Sequence[int]], active: Sequence[int], *,
                   step: int) -> ComputeMismatch | None:
        """The error the gathered canary ``rows`` show among the ``active`` ranks (None when
        their probes agree, or when the self-test turns the canary off: module docstring)."""
        sent = [r for r in active if rows[r][0] != NONE]
        if not sent:
            return None
        bad = [r for r in sent if rows[r][0] != PROBED]
        if any(rows[r][0] == UNBUILT for r in bad):
            self._off(step, bad)
            return None
        if bad:
            self._tolerate(step, bad, "computed two different results from the same probe "
                           "(non-deterministic kernels)")
            return None
        values = [tuple(rows[r][HEAD:]) for r in sent]
        vote = plurality(values)
        if not vote.differing:
            return None
        off = [sent[i] for i in vote.differing]
        head = rows[sent[0]]
        if head[3] == 0:
            self._tolerate(step, off, "gave another result than the others for the start-up "
                           "probe (other thread counts, CPUs or devices, or a fault already "
                           "present)")
            return None
        names = [n for j, (n, _) in enumerate(self.guard.tracked)
                 if plurality([rows[r][HEAD + j] for r in sent]).differing]
        first = self.guard.tracked.index(next(t for t in self.guard.tracked
                                              if t[0] == names[0])) if names else 0
        split = split_view([format(rows[r][HEAD + first] & _MASK64, "016x") for r in sent],
                           vote.differing, sent)
        return ComputeMismatch(
            f"the ranks computed different gradients from the same probe (probe {head[3]}: "
            f"rank {head[2]}'s input slice of step {head[1]}, the same parameters, dropout seed "
            f"and cotangent on every rank): first differing parameter "
            f"{names[0] if names else '?'}, gradient digest {split}; drain the named node and "
            "rerun the job on other hardware", step=step, ranks=off, params=names)

    def _tolerate(self, step: int, ranks: list[int], why: str) -> None:
        """From now on every rank compares probes within a tolerance (each reads the same
        rows, so all switch together), saying what is no longer seen."""
        self.tolerant = True
        self._pending = None
        self._say(UNREPRODUCIBLE_EVENT, step, ranks, f"{why}; a bitwise probe cannot tell that "
                  "from silent data corruption, so from now on the canary compares each probe's "
                  f"gradients within {RTOL:g} of their mass (one gather per probe): an error "
                  "below that — a 1-ulp error in one element — is no longer seen")

    def _off(self, step: int, ranks: list[int]) -> None:
        """The canary stops (on every rank, each reading the same rows; or on this rank, whose
        probe raised), saying why."""
        if not self.on:
            return
        self.on = False
        self._input, self._unbuilt = None, False
        why = (f"could not run the probe ({self._failure})" if self._failure else
               "could not rebuild the probe's input from the owner's slice (its call's "
               "arguments have another structure)")
        self._say(UNAVAILABLE_EVENT, step, ranks, f"{why}: compute canary off, no rank's "
                  "computation is compared from now on (clocks, averaging and replicas still "
                  "are); pass canary_every=0 to silence this")

    def _say(self, kind: str, step: int, ranks: list[int], detail: str) -> None:
        named = [self.guard.global_ranks[r] for r in ranks]
        detail = f"compute canary: rank(s) {named} {detail}"
        self.guard.events.append(Event(kind, step, named, None, [], detail))
        warnings.warn(detail, stacklevel=3)


def _same(a: list[int] | torch.Tensor, b: list[int] | torch.Tensor) -> bool:
    return a == b if isinstance(a, list) else bool(torch.equal(a, b))


def _marked(combined: int | torch.Tensor, status: int) -> int | torch.Tensor:
    """The combined digest, moved by a fixed mark when the probe did not run cleanly, so that
    a rank that could not probe disagrees with one that did."""
    if status == PROBED:
        return combined
    mark = mix_int(status) & _MASK64
    mark = mark - (1 << 64) if mark >> 63 else mark
    return combined ^ mark


def _joining(ddp: Any) -> bool:
    """Inside ``Join([ddp])``: a joined rank would never reach the canary's broadcast."""
    config = getattr(ddp, "_join_config", None)
    return bool(config is not None and config.enable)


def _wire_device(group: Any, device: torch.device) -> torch.device:
    return checks._collective_device(group, device)


def canary_for(guard: Any, every: int) -> Canary | None:
    """The guard's canary, or None when ``every`` is 0 (off) or nothing is tracked."""
    return Canary(guard, every) if every > 0 and guard.tracked else None


class StepDigests:
    """What rides in the step row, for the failure gather: the replica slices' row, then the
    canary's; a divergence is the replicas' first, else the canary's."""

    def __init__(self, replicas: ReplicaSlices, canary: Canary) -> None:
        self.replicas, self.canary = replicas, canary

    def gather_row(self) -> list[int]:
        return self.replicas.gather_row() + self.canary.gather_row()

    def divergence(self, rows: Sequence[Sequence[int]], active: Sequence[int], *,
                   step: int) -> ConsistencyError | None:
        cut = 1 + self.replicas.width
        return (self.replicas.divergence([r[:cut] for r in rows], active, step=step)
                or self.canary.divergence([r[cut:] for r in rows], active, step=step))


def step_digests(replicas: ReplicaSlices, canary: Canary | None) -> ReplicaSlices | StepDigests:
    """The step row's digests: the replica slices alone, or with the canary's."""
    return replicas if canary is None else StepDigests(replicas, canary)
