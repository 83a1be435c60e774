"""Where the bucket plan is made: the bucketed engine's planners, and the frames cut from a plan.

A *plan* is the order in which parameters enter the wire, grouped by the planner's bucket ids.
The engine then cuts that ordered gradient stream into *frames* of at most ``cap`` elements:
frame sizes depend only on the total element count and the cap — never on the plan — so two
ranks that planned differently still issue the same number of allreduces of the same sizes.
That is deliberate: a plan disagreement must surface as a ``BucketMisalignment`` from the
control block (the frame carries different parameters on different ranks), not as a gloo abort
(SIGABRT on a size mismatch) or an NCCL hang. A frame may split a parameter; its membership
digest covers each member's (name, shape, dtype, start:stop) slice.

Planners (``SyncConfig.planner``, a ``Planner``):
  ``static``           size cap, reverse registration order (DDP's order: last layers' gradients
                       are ready first). Same on every rank.
  ``norm-ema``         the seed's F2 exactly as written: for each parameter *with a local
                       gradient*, norm = ‖grad‖ on THIS rank, EMA ← 0.999·EMA + 0.001·norm
                       (EMA starts at the first norm), bucket id = ⌊norm / (0.85·EMA)⌋; buckets in
                       ascending id, parameters in registration order within a bucket. Parameters
                       with no local gradient (the seed skips them) go last, zero-filled. Local
                       norms differ between ranks, so the plan is expected to differ: measured,
                       not assumed.
  ``norm-ema-agreed``  the same rule, but norm and EMA come from the *synchronized* gradients of
                       the previous step — bitwise identical on every rank — so the plan agrees
                       by construction, with no extra traffic. Step 0 (no history) is one
                       bucket in registration order. A parameter with no gradient on any rank
                       keeps its EMA and counts as norm 0.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from dataclasses import dataclass

from openclaw_ref.arms.config import Planner
from openclaw_ref.sync.errors import BadInput
from openclaw_ref.sync.evidence.control_layout import membership_digest

TAU = 0.85  # the seed's τ = 0.85 × EMA
ALPHA = 0.999  # the seed's EMA decay
MISSING_GROUP = 1 << 30  # norm-ema: parameters without a local gradient, issued last


@dataclass(frozen=True)
class BucketPlan:
    order: tuple[int, ...]  # parameter indices (in registration order) as they go on the wire
    groups: tuple[int, ...]  # the planner's bucket id of each entry of ``order``


@dataclass(frozen=True)
class ParamInfo:
    name: str
    shape: tuple[int, ...]
    dtype: str
    numel: int


@dataclass(frozen=True)
class Piece:
    param: int  # parameter index
    start: int  # slice of the flattened parameter
    stop: int
    offset: int  # position in the frame


@dataclass(frozen=True)
class Frame:
    index: int
    elements: int
    pieces: tuple[Piece, ...]
    digest: int
    names: tuple[str, ...]


def cut_frames(plan: BucketPlan, params: Sequence[ParamInfo], cap_elements: int) -> list[Frame]:
    """Cut the plan-ordered stream into frames of ``cap_elements`` (the last one shorter)."""
    if cap_elements < 1:
        raise BadInput("bucket cap must hold at least one element")
    frames: list[Frame] = []
    pieces: list[Piece] = []
    fill = 0

    def close() -> None:
        nonlocal pieces, fill
        members = [(params[p.param].name, params[p.param].shape, params[p.param].dtype,
                    p.start, p.stop) for p in pieces]
        frames.append(Frame(len(frames), fill, tuple(pieces), membership_digest(members),
                            tuple(dict.fromkeys(m[0] for m in members))))
        pieces, fill = [], 0

    for i in plan.order:
        start, numel = 0, params[i].numel
        while start < numel:
            take = min(numel - start, cap_elements - fill)
            pieces.append(Piece(i, start, start + take, fill))
            start += take
            fill += take
            if fill == cap_elements:
                close()
    if fill:
        close()
    return frames


class BucketPlanner(abc.ABC):
    """Makes the plan of a step. ``needs_local_norms``: ``plan`` wants this rank's gradient
    norms; ``needs_synced_norms``: ``observe`` wants the synchronized ones after the step."""

    name: Planner
    needs_local_norms = False
    needs_synced_norms = False

    def __init__(self, params: Sequence[ParamInfo]) -> None:
        self.params = list(params)

    @abc.abstractmethod
    def plan(self, local_norms: Sequence[float | None] | None) -> BucketPlan:
        """The plan for the step about to be synchronized."""

    def observe(self, synced_norms: Sequence[float | None]) -> None:
        """Norms of the synchronized gradients of an applied step (identical on all ranks)."""


class StaticPlanner(BucketPlanner):
    name = Planner.STATIC

    def plan(self, local_norms=None) -> BucketPlan:
        order = tuple(reversed(range(len(self.params))))
        return BucketPlan(order, (0,) * len(order))


def _norm_ema_plan(norms: Sequence[float | None], ema: dict[int, float], update: bool,
                   missing_last: bool) -> BucketPlan:
    ids: list[tuple[int, int]] = []  # (group, index) in registration order
    for i, norm in enumerate(norms):
        if norm is None:
            ids.append((MISSING_GROUP if missing_last else 0, i))
            continue
        if update:
            ema[i] = ALPHA * ema.get(i, norm) + (1 - ALPHA) * norm
        e = ema.get(i, 0.0)
        ids.append((int(norm / (TAU * e)) if e > 0 else 0, i))
    ids.sort(key=lambda t: t[0])  # stable: registration order within a bucket id
    return BucketPlan(tuple(i for _, i in ids), tuple(g for g, _ in ids))


class NormEmaPlanner(BucketPlanner):
    """The seed's rule on each rank's *local* gradient norms (see module docstring)."""

    name = Planner.NORM_EMA
    needs_local_norms = True

    def __init__(self, params: Sequence[ParamInfo]) -> None:
        super().__init__(params)
        self.ema: dict[int, float] = {}

    def plan(self, local_norms) -> BucketPlan:
        return _norm_ema_plan(local_norms, self.ema, update=True, missing_last=True)


class AgreedNormEmaPlanner(BucketPlanner):
    """The seed's rule on the *synchronized* norms of the previous applied step."""

    name = Planner.NORM_EMA_AGREED
    needs_synced_norms = True

    def __init__(self, params: Sequence[ParamInfo]) -> None:
        super().__init__(params)
        self.ema: dict[int, float] = {}
        self.last: list[float | None] | None = None

    def plan(self, local_norms=None) -> BucketPlan:
        if self.last is None:
            order = tuple(range(len(self.params)))
            return BucketPlan(order, (0,) * len(order))
        return _norm_ema_plan([0.0 if n is None else n for n in self.last], self.ema,
                              update=False, missing_last=False)

    def observe(self, synced_norms) -> None:
        for i, norm in enumerate(synced_norms):
            if norm is not None:
                self.ema[i] = ALPHA * self.ema.get(i, norm) + (1 - ALPHA) * norm
        self.last = list(synced_norms)


PLANNERS: dict[Planner, type[BucketPlanner]] = {
    cls.name: cls for cls in (StaticPlanner, NormEmaPlanner, AgreedNormEmaPlanner)}


def make_planner(kind: Planner | str, params: Sequence[ParamInfo]) -> BucketPlanner:
    """The planner ``kind`` (a ``Planner`` or its string) over ``params``."""
    if kind not in PLANNERS:
        raise BadInput(f"unknown planner {kind!r}; choose one of {', '.join(PLANNERS)}")
    return PLANNERS[Planner(kind)](params)
