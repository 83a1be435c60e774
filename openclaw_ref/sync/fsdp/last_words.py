"""Why FSDP2's own collective failed, from what the ranks left in the store — at no cost to a
step where every parameter has its gradient and every FSDP group reduces.

Two of the FSDP2 corpus's mistakes diverge inside FSDP2's backward collectives, before the step's
exchange: a rank on which a parameter got no gradient brings a shorter reduce-scatter input (gloo
aborts a process on the size mismatch; its peer sees "Connection reset by peer"), and a rank
whose gradient sync is off skips its reduce-scatters (its all-gathers meet its peers'
reduce-scatters: a timeout, or an abort where the sizes differ). Comparing every reduce-scatter
across ranks first would cost one collective per FSDP group on every step. Instead a rank
writes a note only when it is about to do something its peers may not:

* ``<namespace>/short/<group>/<rank>`` = ``steps.backwards.numel`` before a reduce-scatter
  smaller than its group's full gradient (a parameter of the group has no gradient here), with
  a warning in this rank's own log — the one place that survives when gloo aborts it;
* ``<namespace>/nosync/<rank>`` = ``steps.backwards.syncing`` at the start of a backward in
  which it reduces fewer than all of its FSDP groups (``set_requires_gradient_sync(False)``:
  every micro-step of gradient accumulation writes one).

Each is a store ``set`` and a ``check`` (a round trip: the server holds the note before this rank
issues a collective that could abort it). When FSDP2's reduce-scatter or all-gather fails on a
rank (gloo's error reaches the wrapper), ``diagnose`` reads the notes for the failing backward —
a rank that left none reduced every group, with every gradient — and names the ranks that
reduce-scatter fewer elements (``MissingGradient``, with the parameters the shortfall fits) or
reduce fewer groups (``GradientsNotAveraged``): not a vote, of two ranks the one lacking is
named. With nothing in the notes, gloo's error stands as it was.

Only strings of integers cross the store (nothing is unpickled). gloo on CPU: a failure there
reaches Python in FSDP2's call. NCCL fails a hung or mismatched collective in its own watchdog
thread, where no note is read.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import combinations

import torch.distributed as dist

from openclaw_ref.sync.errors import ConsistencyError, GradientsNotAveraged, MissingGradient

FIX = ("FSDPModule.set_reduce_scatter_unused_params(True) reduce-scatters zeros for a parameter "
       "without a gradient, as DDP does")


@dataclass(frozen=True)
class Clock:
    """Where a rank is: optimizer steps taken, backwards started, FSDP groups set to reduce."""

    opt_steps: int
    backwards: int
    syncing: int

    def encode(self, value: int | None = None) -> str:
        """``steps.backwards.value``: a note of this backward (``value`` default: syncing)."""
        return f"{self.opt_steps}.{self.backwards}.{self.syncing if value is None else value}"


def _decode(raw: bytes) -> tuple[int, int, int] | None:
    try:
        steps, backwards, value = (int(x) for x in raw.decode().split("."))
    except ValueError:
        return None
    return steps, backwards, value


@dataclass(frozen=True)
class GroupPlan:
    """One wrapped FSDP group: its full reduce-scatter input (every parameter with a gradient)
    and each parameter's share of it, by name."""

    name: str  # the FSDP module's path in the model ("" for the root)
    full_numel: int
    param_numel: dict[str, int]

    def fitting(self, shortfall: int) -> list[str]:
        """The parameters of the fewest (up to three) whose shares sum to the shortfall — every
        such set's, when several fit — or all of them when none does."""
        shares = list(self.param_numel.items())
        for k in range(1, min(3, len(shares)) + 1):
            fits = [c for c in combinations(shares, k) if sum(n for _, n in c) == shortfall]
            if fits:
                return sorted({name for c in fits for name, _ in c})
        return sorted(self.param_numel)


class LastWords:
    """One per hardened FSDP2 model: ``groups`` is how many FSDP groups a rank reduces when its
    gradient sync is on (the same on every rank: the start-up check compared the groups)."""

    def __init__(self, store: dist.Store, namespace: str, rank: int,
                 global_ranks: Sequence[int], plans: list[GroupPlan], groups: int) -> None:
        self.store, self.namespace, self.rank = store, namespace, rank
        self.global_ranks, self.plans, self.groups = list(global_ranks), plans, groups
        self.written = {"short": 0, "nosync": 0}  # notes, by kind
        self.unwritten = 0  # notes the store refused: a note never stops training

    def _write(self, kind: str, key: str, value: str) -> None:
        try:
            self.store.set(f"{self.namespace}/{kind}/{key}", value)
            self.store.check([f"{self.namespace}/{kind}/{key}"])  # a round trip: it is there
        except RuntimeError as exc:  # torch's store errors (DistStoreError, DistNetworkError)
            self.unwritten += 1
            if self.unwritten == 1:
                warnings.warn(f"openclaw: the store refused a note ({exc}); a failed FSDP2 "
                              "collective may then go unexplained", RuntimeWarning,
                              stacklevel=3)
            return
        self.written[kind] += 1

    def backward_started(self, clock: Clock) -> None:
        """At the start of every backward: the no-sync note, when this rank reduces fewer
        groups than all."""
        if clock.syncing < self.groups:
            self._write("nosync", str(self.rank), clock.encode())

    def before_reduce_scatter(self, group: int, numel: int, clock: Callable[[], Clock]
                              ) -> None:
        """Before every reduce-scatter: the short note and warning, when this one is short
        (``clock`` is read only then: a full reduce-scatter costs one comparison)."""
        plan = self.plans[group]
        if numel >= plan.full_numel:
            return
        self._write("short", f"{group}/{self.rank}", clock().encode(numel))
        missing = ", ".join(plan.fitting(plan.full_numel - numel))
        warnings.warn(
            f"openclaw: rank {self.global_ranks[self.rank]} reduce-scatters FSDP group "
            f"'{plan.name or '<root>'}' without a gradient for {missing} ({numel:,} of "
            f"{plan.full_numel:,} elements); where another rank has one, gloo aborts a process "
            f"on the size mismatch ({FIX})", RuntimeWarning, stacklevel=2)

    def _noted(self, key: str, clock: Clock, default: int) -> int:
        """The value a rank noted under ``key`` for ``clock``'s backward, else ``default``."""
        if self.store.check([key]):
            got = _decode(self.store.get(key))
            if got is not None and got[:2] == (clock.opt_steps, clock.backwards):
                return got[2]
        return default

    def diagnose(self, clock: Clock, group: int | None = None, numel: int | None = None
                 ) -> ConsistencyError | None:
        """What the notes show about a collective that failed on this rank in ``clock``'s
        backward — a reduce-scatter of ``group`` with ``numel`` elements, or an all-gather
        (``group`` None) — or None: nothing, or the store cannot be read (its host may be what
        failed), so gloo's error stands."""
        try:
            return self._diagnose(clock, group, numel)
        except RuntimeError:
            return None

    def _diagnose(self, clock: Clock, group: int | None, numel: int | None
                  ) -> ConsistencyError | None:
        world, me = len(self.global_ranks), self.global_ranks[self.rank]
        syncing = [clock.syncing if r == self.rank else
                   self._noted(f"{self.namespace}/nosync/{r}", clock, self.groups)
                   for r in range(world)]
        fewer = [r for r in range(world) if syncing[r] < max(syncing)]
        if fewer:
            named = [self.global_ranks[r] for r in fewer]
            said = ", ".join(f"rank {self.global_ranks[r]} {syncing[r]}" for r in range(world))
            return GradientsNotAveraged(
                f"backward {clock.backwards}: the ranks reduce different numbers of FSDP groups "
                f"({said} of {self.groups}): set_requires_gradient_sync(False) on ranks {named} "
                f"left their peers' reduce-scatters unmatched (rank {me}'s collective failed)",
                step=clock.opt_steps, ranks=named)
        if group is None:
            return None
        plan = self.plans[group]
        sizes = [numel if r == self.rank else
                 self._noted(f"{self.namespace}/short/{group}/{r}", clock, plan.full_numel)
                 for r in range(world)]
        short = [r for r in range(world) if sizes[r] < max(sizes)]
        if not short:
            return None
        named = [self.global_ranks[r] for r in short]
        params = sorted({p for r in short for p in plan.fitting(max(sizes) - sizes[r])})
        said = ", ".join(f"rank {self.global_ranks[r]} {sizes[r]:,}" for r in range(world))
        return MissingGradient(
            f"backward {clock.backwards}: the reduce-scatter inputs of FSDP group "
            f"'{plan.name or '<root>'}' differ in size ({said} elements): no gradient on ranks "
            f"{named} for {', '.join(params)} (fitting the shortfall), which gloo cannot reduce "
            f"({FIX})", step=clock.opt_steps, ranks=named, params=params)


def group_plan(name: str, fsdp_group, names: dict[int, str]) -> GroupPlan:
    """``fsdp_group``'s full reduce-scatter input as FSDP2 lays it out (each parameter's
    dim-0-padded shard × the shard group's size, 1 where nothing is sharded); ``names``: sharded
    parameter id → name."""
    world = getattr(fsdp_group.mesh_info, "shard_mesh_size", 1)  # replicate_with_fsdp: none
    shares = {names.get(id(fp.sharded_param), "?"): fp.padded_sharded_param_size.numel() * world
              for fp in fsdp_group.fsdp_params}
    return GroupPlan(name, sum(shares.values()), shares)
