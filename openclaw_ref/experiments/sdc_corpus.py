"""The silent-data-corruption corpus: one rank's hardware computes matrix products wrong
(``core.sdc_faults``), under stock DDP, ``harden()`` with the compute canary off
(``canary_every=0``) and on — who notices, when, and whom it names.

Every case is a plain user loop (no openclaw training loop: the loop a user writes) on
``SdcNet`` (an MLP with dropout) over rank-dependent batches, the fault on the last rank from
``fault_step`` on. What each column surfaced is all that is read: the ``ConsistencyError`` it
raised (kind, step, ranks, parameters), or none; then whether the final weights differ from
the fault-free run's (``silent-corruption``) or not (``no-effect``). ``rate_task`` repeats an
intermittent or data-dependent fault over many probes and counts how many the canary named
(raised) or reported (a ``CanaryTransient`` event: a one-off it does not raise on alone).
``tests/test_sdc_corpus.py`` asserts on these; the compare section ``sdc`` publishes them.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import asdict, dataclass, field

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from openclaw_ref.core.sdc_faults import (
    SDC_DEFAULTS,
    SDC_FAULTS,
    FaultyMatmul,
    entered,
    sdc_model,
)
from openclaw_ref.sync.base import SyncConfig
from openclaw_ref.sync.errors import ComputeMismatch, ConsistencyError
from openclaw_ref.sync.hardening import harden

FEATURES, HIDDEN, CLASSES, BATCH = 16, 32, 4, 8


class Column(enum.StrEnum):
    """Who watches: stock DDP, ``harden()`` with the canary off, ``harden()`` with it on."""

    STOCK = "stock DDP"
    OFF = "harden(), canary off"
    ON = "harden(), canary on"


class Outcome(enum.StrEnum):
    DETECTED = "detected"
    SILENT = "silent-corruption"
    NO_EFFECT = "no-effect"


class SdcNet(nn.Module):
    """An MLP with dropout: what the probe must reproduce bit for bit on every rank."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(FEATURES, HIDDEN)
        self.mid = nn.Linear(HIDDEN, HIDDEN)
        self.out = nn.Linear(HIDDEN, CLASSES)
        self.drop = nn.Dropout(0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.drop(F.relu(self.inp(x)))
        return self.out(F.relu(self.mid(h)))


def sdc_batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank-dependent data: other values on every rank and step, the same on every run."""
    g = torch.Generator().manual_seed(1_000 * rank + step)
    return torch.randn(BATCH, FEATURES, generator=g), torch.randint(0, CLASSES, (BATCH,),
                                                                     generator=g)


@dataclass(frozen=True)
class SdcCase:
    """One run: ``fault`` (a name of ``SDC_FAULTS``, "" for none) with ``value`` on the last
    rank from ``fault_step``; ``canary_every`` K for the canary column."""

    fault: str = ""
    value: str | None = None
    steps: int = 10
    fault_step: int = 2
    canary_every: int = 2
    trial: int = 0  # shifts the data and the fault's call sequence (``rate_task``)
    replicate: bool = False  # the composable ``replicate()`` instead of the DDP wrapper
    verdict_at: str = "auto"  # ``SyncConfig.verdict_at`` of the hardened columns
    then: str = ""  # the part degrades: from ``then_step`` on, this fault (VALUE 1) instead
    then_step: int = 0

    @property
    def resolved_value(self) -> str:
        return SDC_DEFAULTS[self.fault] if self.value is None else self.value


@dataclass
class SdcRun:
    """What one column surfaced on one rank."""

    column: str
    fault: str
    outcome: str = Outcome.NO_EFFECT.value
    kind: str = ""
    step: int | None = None
    ranks: list[int] = field(default_factory=list)
    params: list[str] = field(default_factory=list)
    steps_run: int = 0
    fired: int = 0  # corrupted op results on the faulty rank (0 elsewhere)
    weights: list[float] = field(default_factory=list)  # the final weights, to compare
    events: list[str] = field(default_factory=list)
    event_ranks: list[list[int]] = field(default_factory=list)  # each event's ranks

    def to_json(self) -> dict:
        return asdict(self)


def _config(column: Column, case: SdcCase) -> SyncConfig | None:
    if column is Column.STOCK:
        return None
    return SyncConfig(canary_every=case.canary_every if column is Column.ON else 0,
                      verdict_at=case.verdict_at)


def run_case(ctx, column: Column, case: SdcCase) -> SdcRun:
    """One column on one rank (``ctx``: anything with ``rank`` and ``world_size``, and a
    ``device``: CPU without one): the user's loop, the fault's matrix unit on the last rank;
    never raises a ``ConsistencyError``."""
    device = getattr(ctx, "device", torch.device("cpu"))
    torch.manual_seed(0)
    model = SdcNet().to(device)
    if case.replicate:
        from torch.distributed._composable import replicate

        ddp = replicate(model)  # the module itself is forwarded, and hardened
    else:
        ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    cfg = _config(column, case)
    state = harden(ddp, cfg, ctx) if cfg is not None else None
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    faulty = case.fault and ctx.rank == ctx.world_size - 1
    mode = (FaultyMatmul(sdc_model(case.fault, case.resolved_value), offset=7919 * case.trial)
            if faulty else None)
    run = SdcRun(column.value, case.fault)
    torch.manual_seed(1 + ctx.rank)  # the dropout streams: rank-dependent, as in a real job
    try:
        with entered(mode):
            for step in range(case.steps):
                if mode is not None:
                    mode.active = step >= case.fault_step
                    if case.then and step == case.then_step:
                        mode.model = sdc_model(case.then, "1")
                x, y = (t.to(device) for t in sdc_batch(step + 97 * case.trial, ctx.rank))
                F.cross_entropy(ddp(x), y).backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
                run.steps_run = step + 1
    except ConsistencyError as exc:
        run.outcome, run.kind, run.step = Outcome.DETECTED.value, exc.kind, exc.step
        run.ranks, run.params = list(exc.ranks), list(exc.params)
    finally:
        if mode is not None:
            run.fired = mode.fired
        if state is not None:
            run.events = [str(e.kind) for e in state.events]
            run.event_ranks = [list(e.ranks) for e in state.events]
            state.close(verify=run.outcome != Outcome.DETECTED.value)
    run.weights = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).tolist()
    return run


def corpus_task(ctx, cases: list[SdcCase], columns: tuple[Column, ...] = tuple(Column)
                ) -> list[dict]:
    """Every case × column on this rank, each against the fault-free run of its column (one
    per column and step count): ``silent-corruption`` where nothing was raised and the weights
    moved."""
    clean: dict[tuple[Column, int], list[float]] = {}
    out = []
    for case in cases:
        for column in columns:
            run = run_case(ctx, column, case)
            if run.outcome != Outcome.DETECTED.value:
                key = (column, case.steps)
                if key not in clean:
                    clean[key] = run_case(ctx, column, SdcCase(steps=case.steps)).weights
                if run.weights != clean[key]:
                    run.outcome = Outcome.SILENT.value
            out.append({**run.to_json(), "weights": [], "case": asdict(case)})
    return out


def rate_task(ctx, fault: str, value: str | None, probes: int, canary_every: int = 1
              ) -> dict:
    """How many of ``probes`` probes the canary names or reports an intermittent or
    data-dependent fault in: each trial is a fresh run whose fault starts just before one
    probe (after the first) and which stops at that probe's verdict. ``named``: it raised
    ``ComputeMismatch`` (a fault that persisted over the probe's re-runs); ``reported``: a
    ``CanaryTransient`` event (a one-off on one rank: raised only once ``canary.STRIKES`` of
    them add up on that rank, which one probe cannot); ``right_rank``: either, naming the
    faulty rank; ``wrong_rank``: anything naming only other ranks."""
    faulty = ctx.world_size - 1
    named = reported = right = wrong = fired = 0
    for trial in range(probes):
        case = SdcCase(fault, value, steps=2 * canary_every + 2, fault_step=canary_every + 1,
                       canary_every=canary_every)
        run = run_case(ctx, Column.ON, dataclasses.replace(case, trial=trial))
        fired += run.fired
        said = [r for k, r in zip(run.events, run.event_ranks) if k == "CanaryTransient"]
        if run.kind == ComputeMismatch.__name__:
            said.append(run.ranks)
            named += 1
        elif said:
            reported += 1
        right += any(faulty in r for r in said)
        wrong += any(faulty not in r for r in said)
    return {"fault": fault, "value": value if value is not None else SDC_DEFAULTS[fault],
            "probes": probes, "named": named, "reported": reported, "right_rank": right,
            "wrong_rank": wrong, "fired": fired}


CORPUS: tuple[SdcCase, ...] = tuple(SdcCase(f) for f in SDC_FAULTS)
