"""The compute canary's outcomes driven on purpose: healthy but non-deterministic jobs (the
emulated GPU noise of ``core.nondeterminism`` on every rank, forward or backward, at a rate,
from step 0 or mid-run) and faulty hardware (``core.sdc_faults`` on one rank, persistent or
intermittent) — what ``harden()`` raised, which events it recorded and where the canary ended.

Every case is the user's plain loop on ``ConfirmNet`` (Linear → BatchNorm → ReLU → Dropout →
Linear → Linear: a bias whose gradient is pure rounding noise, the model the issue that made the
canary confirm its suspicions was found on), over rank-dependent batches, hardened with
``SyncConfig(canary_every=K)``. ``tests/test_canary_confirm.py`` asserts on these.
"""

from __future__ import annotations

from contextlib import ExitStack
from dataclasses import asdict, dataclass, field

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from openclaw_ref.core.nondeterminism import NoisyKernels, Phase
from openclaw_ref.core.sdc_faults import FaultyMatmul, sdc_model
from openclaw_ref.sync.base import SyncConfig
from openclaw_ref.sync.errors import ConsistencyError
from openclaw_ref.sync.hardening import harden

FEATURES, HIDDEN, CLASSES, BATCH = 12, 24, 4, 8


class ConfirmNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(FEATURES, HIDDEN), nn.BatchNorm1d(HIDDEN), nn.ReLU(),
                                 nn.Dropout(0.2), nn.Linear(HIDDEN, HIDDEN), nn.ReLU(),
                                 nn.Linear(HIDDEN, CLASSES))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


@dataclass(frozen=True)
class Noise:
    """Honest non-determinism on EVERY rank: ``rate`` per matrix product, in ``phase``, from
    ``start`` on, each rank's own random stream."""

    rate: float
    phase: Phase = Phase.BOTH
    start: int = 0


@dataclass(frozen=True)
class Fault:
    """Faulty hardware on ``rank``: ``core.sdc_faults``'s ``name`` with ``value``, from
    ``start`` on."""

    name: str
    rank: int
    value: str = ""
    start: int = 0


@dataclass(frozen=True)
class ConfirmCase:
    steps: int = 24
    every: int = 2
    noise: Noise | None = None
    fault: Fault | None = None
    seed: int = 0  # shifts the noise streams: another trial of the same case
    bf16: bool = False  # the forward under bf16 autocast (the probe too: it runs inside it)


@dataclass
class ConfirmRun:
    """What one rank saw: the error (kind, step, ranks, message) or none, the events (kind,
    ranks), the canary's summary, how often the noise and the fault fired here."""

    error: str = ""
    step: int | None = None
    ranks: list[int] = field(default_factory=list)
    message: str = ""
    events: list[tuple[str, list[int]]] = field(default_factory=list)
    canary: dict = field(default_factory=dict)
    steps_run: int = 0
    noised: int = 0
    fired: int = 0

    def to_json(self) -> dict:
        return asdict(self)


def confirm_batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(10_000 * rank + step)
    return torch.randn(BATCH, FEATURES, generator=g), torch.randint(0, CLASSES, (BATCH,),
                                                                     generator=g)


def confirm_task(ctx, case: ConfirmCase) -> dict:
    """``case`` on this rank; never raises a ``ConsistencyError`` (it is recorded)."""
    torch.manual_seed(0)
    model = ConfirmNet()
    ddp = DDP(model)
    state = harden(ddp, SyncConfig(canary_every=case.every), ctx)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    noise = (NoisyKernels(case.noise.rate, 7919 * case.seed + 104_729 * (ctx.rank + 1),
                          case.noise.phase, active=False) if case.noise else None)
    fault = case.fault if case.fault and case.fault.rank == ctx.rank else None
    faulty = FaultyMatmul(sdc_model(fault.name, fault.value)) if fault else None
    run = ConfirmRun()
    torch.manual_seed(1 + ctx.rank)
    try:
        with ExitStack() as stack:
            for mode in (noise, faulty):
                if mode is not None:
                    stack.enter_context(mode)
            for step in range(case.steps):
                if noise is not None:
                    noise.active = step >= case.noise.start
                if faulty is not None:
                    faulty.active = step >= fault.start
                x, y = confirm_batch(step, ctx.rank)
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=case.bf16):
                    loss = F.cross_entropy(ddp(x), y)
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
                run.steps_run = step + 1
    except ConsistencyError as exc:
        run.error, run.step, run.ranks, run.message = exc.kind, exc.step, exc.ranks, str(exc)
    finally:
        run.events = [(str(e.kind), list(e.ranks)) for e in state.events]
        run.canary = state.summary()["canary"]
        run.noised = noise.noised if noise is not None else 0
        run.fired = faulty.fired if faulty is not None else 0
        state.close(verify=not run.error)
    return run.to_json()


def confirm_cases_task(ctx, cases: list[ConfirmCase]) -> list[dict]:
    """Every case in order on this rank (one pool, many cases)."""
    return [confirm_task(ctx, case) for case in cases]
