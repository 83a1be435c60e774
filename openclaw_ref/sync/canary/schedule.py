"""The compute canary of ``harden()``'s step guard, on by default (``SyncConfig.canary_every``):
every K steps every rank runs the same small probe (``canary.probe``) and the ranks' results
are compared. A rank whose hardware computes wrong (silent data corruption in a matmul, a
mercurial core) makes its probe differ. Everything else the guard checks shows *agreement*; an
SDC'd contribution is averaged in, every rank receives the same wrong gradient and every
agreement check passes — this one compares *computation*.

The schedule (capture step c = n·K, n = 0, 1, …; owner = n mod W):
  1. the forward of step c: every rank notes its call's input (``canary.input.capture``);
  2. the settle of step c, once its verdict passed on every rank — every rank read the same
     reduced block, so every rank is here, at the same step: before the first probe, the
     ranks' fingerprints (``canary.fingerprint``: where they differ, the canary starts on its
     tolerance); then the owner's slice is broadcast (``canary.input.share``). Never while
     ``DDP.join()`` is active (a joined rank runs no settle);
  3. the next forward with gradients enabled (step c + 1): before the module's forward (after
     DDP's buffer broadcast), every rank runs the probe on the current parameters — equal on
     every rank, the replica check proves it — with the owner's slice, the seed of probe n and
     a cotangent from a fixed generator;
  4. the compare, before the optimizer applies step c + 1. Bitwise (the default where the
     fingerprints agree): the probe's combined digest is XORed into the replica digest of that
     step's exchange — no byte more on the wire. Under the tolerance: one gather of every
     rank's figures in the settle of that step (``canary.tolerance``).
A mismatch is a suspicion (``canary.verdict``): every rank re-runs the same probe and the runs
are gathered and classified — a persistent difference raises ``ComputeMismatch`` naming the
suspects (with no majority, both sides: ``vote``); the job's own non-determinism switches the
comparison to the tolerance (or widens it) and never raises; a one-off on one rank is a
``CanaryTransient`` event, and ``STRIKES`` one-offs beyond the tolerance on the same rank, with
none on any other, raise. A persistent fault present at step t is named by step t + K + 1.

What it cannot see: a fault that spares the probe (an op the probe does not run, data the
probe's slice does not reach, an intermittent fault between probes), a fault present on every
rank alike, and, under the tolerance, an error below it; a one-off within the tolerance — what
honest non-determinism looks like — is reported, never raised.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from openclaw_ref.sync.attached import eager
from openclaw_ref.sync.canary import row as canary_row
from openclaw_ref.sync.canary import verdict as canary_verdict
from openclaw_ref.sync.canary.fingerprint import exchange, local_fingerprint, unequal
from openclaw_ref.sync.canary.input import ProbeInput, capture, rebuild, share
from openclaw_ref.sync.canary.probe import ProbeResult, run_probe, unwrapped
from openclaw_ref.sync.canary.row import (
    FORWARD_REPLACED,
    HEAD,
    LOW_FLAG,
    NONE,
    OTHER_PATHS,
    PROBED,
    PROBED_FLAG,
    SEED0,
    STRIKES,
    UNBUILT,
    UNPROBED,
    WIDEN,
    CanaryEvent,
    Mode,
    ProbeCall,
)
from openclaw_ref.sync.canary.tolerance import off_ranks, tolerance
from openclaw_ref.sync.canary.verdict import RERUNS, Finding, Outcome, classify
from openclaw_ref.sync.errors import ComputeMismatch, Event
from openclaw_ref.sync.evidence import checks
from openclaw_ref.sync.evidence.replica_digest import ReplicaDigest
from openclaw_ref.sync.evidence.vote import majority
from openclaw_ref.sync.guard import GuardBase


class Canary:
    """The canary of one step guard (module docstring). Reads the guard's ``clock``,
    ``module``, ``tracked``, ``group``, ``rank``, ``world_size``, ``events``, ``global_ranks``
    and whether it is ``joining()``: any ``GuardBase``."""

    def __init__(self, guard: GuardBase, every: int) -> None:
        self.guard = guard
        self.every = every
        self.mode = Mode.BITWISE
        self.low = False  # some rank's probe computed in a 16-bit float (sticky)
        self.widened = 1.0  # the tolerance's factor after noise beyond it (``_noisy``)
        self.why = ""  # why the mode is what it is (summary)
        self.probing = False
        self.digest = ReplicaDigest()
        self.device = guard.tracked[0][1].device if guard.tracked else torch.device("cpu")
        self.probes = 0  # probes run so far (the same count on every rank)
        self.transients: dict[int, int] = {}  # group rank → one-offs seen
        self.strikes: dict[int, int] = {}  # group rank → one-offs beyond the tolerance
        self.noisy: set[int] = set()  # group ranks with a one-off within the tolerance
        self.varied: set[int] = set()  # group ranks whose runs ever varied, by any amount
        self.held_bytes = 0  # the most gradient bytes a probe held
        self.param_bytes = 0  # FSDP2: the most full-parameter bytes a probe gathered at once
        self._fingerprinted = False
        self._noted: ProbeInput | None = None  # this rank's input at the capture step
        self._noted_at = -1
        self._input: tuple | None = None  # the shared probe input, awaiting the next forward
        self._unbuilt = False
        self._head = [NONE, 0, 0, 0]  # of the probe awaiting its compare
        self._call: ProbeCall | None = None  # the last probe's call, for its reruns
        self._run0: ProbeResult | None = None  # and its result
        self._pending: int | torch.Tensor | None = None  # the digest to fold, bitwise
        self._compare_at = -1  # the step whose verdict compares the last shared probe
        self._compare_tolerant = False  # ... by gathering figures (under the tolerance then)
        self._installed: Any = None  # the forward the hooked module carried at hardening
        self._forward: Any = None  # the forward the probe calls (an instance's own, if any)

    @property
    def on(self) -> bool:
        return self.mode is not Mode.OFF

    @property
    def tolerant(self) -> bool:
        return self.mode is Mode.TOLERANCE

    @property
    def rtol(self) -> float:
        """The tolerance now: the probe's precision's (``canary.tolerance.tolerance``), times
        what the job's own noise made it widen."""
        return tolerance(self.low) * self.widened

    def install(self) -> Any:
        """The forward pre-hook (with the call's keyword arguments) that notes and probes."""
        self._remember_forwards()
        return self.guard.module.register_forward_pre_hook(eager(self._before_forward),
                                                          with_kwargs=True)

    def _remember_forwards(self) -> None:
        """A forward the instance already carries at hardening (Accelerate's mixed-precision
        wrapper: autocast, outputs to fp32) is what every call runs, so the probe runs it too;
        a compiled module is probed through the module it wraps (``canary.probe``)."""
        module = self.guard.module
        self._installed = module.__dict__.get("forward")
        self._forward = unwrapped(module).__dict__.get("forward")

    # -- 1 and 3: the forward ------------------------------------------------------------------
    def _before_forward(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        if self.probing or not self.on or not torch.is_grad_enabled():
            return
        if module.__dict__.get("forward") is not self._installed:  # patched for this call
            self._off(self.guard.clock, list(range(self.guard.world_size)), FORWARD_REPLACED)
            return
        if self._input is not None or self._unbuilt:
            self._probe()
        clock = self.guard.clock
        if clock % self.every == 0 and self._noted_at != clock:
            self._noted, self._noted_at = capture(args, kwargs), clock

    def _probe(self) -> None:
        status = UNBUILT if self._unbuilt else PROBED
        self._run0 = self._call = None
        if status == PROBED:
            args, kwargs = self._input
            buffers = {n: b.detach().clone()
                       for n, b in unwrapped(self.guard.module).named_buffers()}
            call = ProbeCall(args, kwargs, SEED0 + self.probes, buffers)
            try:
                self._run0, self._call = self._execute(call), call
                self.held_bytes = max(self.held_bytes, self._run0.held_bytes)
                self.param_bytes = max(self.param_bytes, self._run0.param_bytes)
            except Exception as exc:  # a probe must never end a healthy job
                status = UNBUILT  # every rank turns the canary off at the compare
                warnings.warn(f"compute canary: this rank's probe raised {type(exc).__name__}: "
                              f"{exc}", stacklevel=2)
        self._input, self._unbuilt = None, False
        self._head[0], self._head[3] = status, self.probes
        self.probes += 1
        if self.mode is Mode.BITWISE:
            self._pending = canary_row.marked(self._run0, status)

    def _execute(self, call: ProbeCall) -> ProbeResult:
        """One run of the probe ``call`` (FSDP2: ``fsdp.canary`` runs it on full tensors)."""
        self.probing = True
        try:
            return run_probe(self.guard.module, self.guard.tracked, call.args, call.kwargs,
                             call.seed, forward=self._forward, digest=self.digest,
                             buffers=call.buffers)
        finally:
            self.probing = False

    # -- 2: the settle of a capture step --------------------------------------------------------
    def settled(self, step: int) -> None:
        """Step ``step`` passed on every rank: under the tolerance, compare the last probe; at
        a capture step, the fingerprints once, then share the owner's slice."""
        if step == self._compare_at and self._compare_tolerant:
            self._compare_within_tolerance(step)  # also on a rank whose probe just failed
        if not self.on or step % self.every or self.guard.joining():
            return
        device = checks.collective_device(self.guard.group, self.device)
        if not self._fingerprinted:
            self._fingerprint(step, device)
        owner = (step // self.every) % self.guard.world_size
        noted = self._noted if self._noted_at == step else None
        self._noted, self._noted_at = None, -1
        shared = share(noted, owner, self.guard.group, device)
        if shared is None:
            return
        self._input = rebuild(noted, shared, self.device)
        self._unbuilt = self._input is None
        self._head[1], self._head[2] = step, owner
        self._compare_at, self._compare_tolerant = step + 1, self.tolerant

    def _fingerprint(self, step: int, device: torch.device) -> None:
        self._fingerprinted = True
        table = exchange(local_fingerprint(self.device, self.guard.module), self.guard.group,
                         device)
        found = unequal(table, self.device.type == "cuda")
        if found is not None:
            ranks, words = found
            self._tolerate(step, ranks, f"cannot be compared bitwise with the others ({words})")
        else:
            self.why = "the ranks' fingerprints agree: probes compared bitwise"

    def _compare_within_tolerance(self, step: int) -> None:
        """Every rank's figures of the last probe, gathered; a rank farther than the
        tolerance from the median makes every rank confirm (``_confirm``)."""
        n = 2 * len(self.guard.tracked)
        mine = ([float(canary_row.flag(self._run0))] + self._run0.figures.tolist()
                if self._run0 is not None else [0.0] * (1 + n))
        rows = self._gather(torch.tensor(mine, dtype=torch.float64))
        self._note_precision([int(row[0]) for row in rows])
        probed = [r for r, row in enumerate(rows) if int(row[0]) & PROBED_FLAG]
        if len(probed) < len(rows):  # some rank could not probe: every rank stops together
            self._off(step, [r for r in range(len(rows)) if r not in probed], UNPROBED)
            return
        if off_ranks([rows[r][1:] for r in probed], self.rtol):
            error = self._confirm(step, everyone=True)
            if error is not None:
                raise error.renumbered(self.guard.global_ranks)

    # -- 4: the exchange, bitwise ---------------------------------------------------------------
    def fold(self, replica: int | torch.Tensor | None) -> int | torch.Tensor | None:
        """The step row's digest with this step's probe folded in (unchanged without one)."""
        pending, self._pending = self._pending, None
        if pending is None:
            self._head[0] = NONE
            return replica
        return canary_row.folded(replica, pending, self.device)

    def gather_row(self) -> list[int]:
        """This rank's part of the failure gather: the head, then one digest per parameter."""
        n = len(self.guard.tracked)
        if self._head[0] == NONE:
            return [NONE, 0, 0, 0] + [0] * n
        mine = self._run0.digest_list() if self._run0 is not None else []
        return list(self._head) + (list(mine) + [0] * n)[:n]

    def divergence(self, rows: Sequence[Sequence[int]], active: Sequence[int], *,
                   step: int) -> ComputeMismatch | None:
        """The error the gathered canary ``rows`` show among the ``active`` ranks, once
        confirmed (None when they agree, or when the confirmation finds no fault)."""
        sent = [r for r in active if rows[r][0] != NONE]
        if not sent:
            return None
        unbuilt = [r for r in sent if rows[r][0] == UNBUILT]
        if unbuilt:
            self._off(step, unbuilt, UNPROBED)
            return None
        if not majority([tuple(rows[r][HEAD:]) for r in sent]).differing:
            return None
        return self._confirm(step, everyone=len(sent) == len(rows))

    # -- the confirmation -----------------------------------------------------------------------
    def _confirm(self, step: int, everyone: bool) -> ComputeMismatch | None:
        """Every rank re-runs the last probe ``RERUNS`` times; the runs are gathered and
        classified (``canary.verdict``) and acted on. ``everyone``: every rank of the group
        probed (else nothing is re-run — under FSDP2 a rerun's all-gathers need every rank —
        and nothing is raised)."""
        if not everyone:
            self._say(CanaryEvent.TRANSIENT, step, [], "the probes differed but some rank did "
                      "not probe, so nothing could be confirmed; nothing raised")
            return None
        runs = [self._run0] + [self._execute(self._call) for _ in range(RERUNS)]
        rows = self._gather(canary_row.encode(runs))
        self._note_precision([row[0] for row in rows])
        decoded = [canary_row.decode(row, len(self.guard.tracked)) for row in rows]
        finding = classify(decoded, self.tolerant, self.rtol)
        return self._act(step, finding)

    def _act(self, step: int, finding: Finding) -> ComputeMismatch | None:
        ranks = list(finding.ranks)
        if finding.outcome is Outcome.PERSISTENT:
            return self._mismatch(step, finding)
        if finding.outcome is Outcome.PATHS:
            self._off(step, ranks, OTHER_PATHS)
        if finding.outcome is Outcome.NONDETERMINISTIC:
            self.varied.update(ranks)
            self._noisy(step, ranks, f"gave other results on re-runs of the same probe "
                        f"(up to {finding.distance:.2g} of the probe gradient's mass apart)")
        elif finding.outcome is Outcome.TRANSIENT:
            return self._transient(step, ranks[0], finding)
        return None

    def _transient(self, step: int, rank: int, finding: Finding) -> ComputeMismatch | None:
        """A one-off on ``rank``: an event; beyond the tolerance a strike, and ``STRIKES`` of
        them raise — only while no other rank's runs ever varied, by any amount: where others
        vary too the job is non-deterministic, and noise that happens to land beyond the
        tolerance on one rank at a time must not add up to a verdict."""
        self.transients[rank] = self.transients.get(rank, 0) + 1
        self.varied.add(rank)
        beyond = finding.distance > self.rtol
        if beyond:
            self.strikes[rank] = self.strikes.get(rank, 0) + 1
        count = self.strikes.get(rank, 0)
        self._say(CanaryEvent.TRANSIENT, step, [rank],
                  f"gave a one-off result on one of {1 + RERUNS} runs of the same probe "
                  f"({finding.distance:.2g} of the probe gradient's mass from the others; "
                  f"the tolerance is {self.rtol:g}): "
                  + (f"beyond the tolerance, {count} of {STRIKES} before it is named"
                     if beyond else "within the noise of a non-deterministic kernel"),
                  warn=beyond)
        if beyond and count >= STRIKES and self.varied == {rank}:
            return self._mismatch(step, finding, intermittent=count)
        if not beyond:
            self.noisy.add(rank)
            if len(self.noisy) >= 2 and self.mode is Mode.BITWISE:
                self._noisy(step, sorted(self.noisy), "gave one-off results within the noise "
                            "on more than one rank")
        return None

    def _note_precision(self, flags: Sequence[int]) -> None:
        """Some rank's probe computed in a 16-bit float: the tolerance is the low one's."""
        self.low = self.low or any(f & LOW_FLAG for f in flags)

    def _noisy(self, step: int, ranks: list[int], why: str) -> None:
        """The job's own non-determinism: bitwise → the tolerance; already tolerant → wider."""
        if self.mode is Mode.BITWISE:
            self._tolerate(step, ranks, f"{why}: the job's kernels are not reproducible")
            return
        self.widened *= WIDEN
        self.why = f"tolerance widened to {self.rtol:g}: the job's noise exceeded it"
        self._say(CanaryEvent.UNREPRODUCIBLE, step, ranks, f"{why}, beyond the tolerance: it "
                  f"is widened to {self.rtol:g} of the probe gradient's mass")

    def _mismatch(self, step: int, finding: Finding, intermittent: int = 0) -> ComputeMismatch:
        """The error of a confirmed finding, its ranks those of the group (renumbered by the
        caller that raises it)."""
        name = self.guard.tracked[finding.param][0] if finding.param is not None else "?"
        return canary_verdict.mismatch_error(finding, step, self._head, name, self.tolerant,
                                             intermittent)

    # -- mode changes and what is said --------------------------------------------------------
    def _tolerate(self, step: int, ranks: list[int], why: str) -> None:
        """From now on every rank compares probes within the tolerance (each reads the same
        rows, so all switch together), saying what is no longer seen."""
        self.mode = Mode.TOLERANCE
        self._pending = None
        self.why = f"tolerance: rank(s) {self._named(ranks)} {why}"
        self._say(CanaryEvent.UNREPRODUCIBLE, step, ranks, f"{why}; so from now on the canary "
                  f"compares each probe's gradients within {self.rtol:g} of the probe "
                  "gradient's mass (one gather per probe): an error below that — a 1-ulp error "
                  "in one element — is no longer seen")

    def _off(self, step: int, ranks: list[int], why: str) -> None:
        """The canary stops on every rank (each reads the same rows, or sees the same
        replaced forward), saying why in the same words everywhere; a warning only where a
        probe could not run (``UNPROBED``), which a healthy set-up never causes."""
        if not self.on:
            return
        self.mode = Mode.OFF
        self._input, self._unbuilt = None, False
        self.why = f"off: {why}"
        self._say(CanaryEvent.UNAVAILABLE, step, ranks, f"{why}: compute canary off, no rank's "
                  "computation is compared from now on (clocks, averaging and replicas still "
                  "are); pass canary_every=0 to silence this", warn=why == UNPROBED)

    def _say(self, kind: CanaryEvent, step: int, ranks: list[int], detail: str,
             warn: bool = False) -> None:
        detail = f"compute canary: rank(s) {self._named(ranks)} {detail}"
        self.guard.events.append(Event(kind, step, self._named(ranks), None, [], detail))
        if warn:
            warnings.warn(detail, stacklevel=3)

    def _named(self, ranks: Sequence[int]) -> list[int]:
        return [self.guard.global_ranks[r] for r in ranks]

    def _gather(self, local: torch.Tensor) -> list[list]:
        device = checks.collective_device(self.guard.group, self.device)
        return checks.gather_rows(local.to(device), self.guard.group).tolist()

    def summary(self) -> dict:
        """What the canary did, for the run's summary (``summary()['canary']``)."""
        return {"every": self.every, "mode": self.mode.value, "why": self.why,
                "probes": self.probes, "rtol": self.rtol, "held_bytes": self.held_bytes,
                "param_bytes": self.param_bytes,
                **canary_row.by_global_rank(self.guard.global_ranks,
                                            transients=self.transients, strikes=self.strikes)}


def canary_for(guard: GuardBase, every: int) -> Canary | None:
    """The guard's canary, or None when ``every`` is 0 (off) or nothing is tracked."""
    return Canary(guard, every) if every > 0 and guard.tracked else None
