"""The compute canary on healthy jobs: it must never fire where no hardware is faulty, and
training must be bitwise the same with it on and off — the weights, the buffers, the RNG
streams.

Healthy jobs (``HealthyJob``): the set-ups a probe must reproduce exactly on every rank or
leave alone — dropout, BatchNorm in training mode (rank-dependent running statistics),
activation checkpointing (reentrant and not), gradient accumulation under ``no_sync``, fp16
autocast with ``torch.amp.GradScaler``, bf16 autocast, a sparse embedding. Each is a plain user
loop on rank-dependent data, run twice on the same ranks — canary off, canary on at every step
(K = 1: the most probes a run can make) — and each run hands back its final state.
``option_task`` does the same on the DDP option matrix (``ddp_option_matrix.CASES``).
``tests/test_canary_healthy.py`` asserts on both; the compare section ``sdc`` counts the alarms.
"""

from __future__ import annotations

import contextlib
import enum

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.checkpoint import checkpoint

from openclaw_ref.experiments import ddp_option_matrix as matrix
from openclaw_ref.sync.base import SyncConfig
from openclaw_ref.sync.errors import ConsistencyError
from openclaw_ref.sync.hardening import harden

FEATURES, HIDDEN, CLASSES, VOCAB = 12, 24, 3, 50


class HealthyJob(enum.StrEnum):
    DROPOUT = "dropout"
    BATCHNORM = "BatchNorm"
    CHECKPOINT = "activation checkpointing"
    CHECKPOINT_REENTRANT = "activation checkpointing (reentrant)"
    ACCUMULATION = "gradient accumulation (no_sync)"
    AMP_FP16 = "fp16 autocast + GradScaler"
    AMP_BF16 = "bf16 autocast"
    SPARSE = "sparse embedding"


class HealthyNet(nn.Module):
    """One small model for every job: an optional sparse embedding in front, an MLP with
    dropout and an optional BatchNorm, optionally checkpointed."""

    def __init__(self, job: HealthyJob) -> None:
        super().__init__()
        self.job = job
        self.embed = nn.Embedding(VOCAB, FEATURES, sparse=True) if job is HealthyJob.SPARSE \
            else None
        self.a = nn.Linear(FEATURES, HIDDEN)
        self.norm = nn.BatchNorm1d(HIDDEN) if job is HealthyJob.BATCHNORM else nn.Identity()
        self.drop = nn.Dropout(0.2)
        self.b = nn.Linear(HIDDEN, CLASSES)

    def _body(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(F.relu(self.norm(self.a(x))))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.embed is not None:
            x = self.embed(x).mean(1)
        if self.job in (HealthyJob.CHECKPOINT, HealthyJob.CHECKPOINT_REENTRANT):
            h = checkpoint(self._body, x, use_reentrant=self.job is HealthyJob.CHECKPOINT_REENTRANT)
        else:
            h = self._body(x)
        return self.b(h)


def _batch(job: HealthyJob, step: int, micro: int, rank: int):
    g = torch.Generator().manual_seed(10_000 * rank + 100 * step + micro)
    y = torch.randint(0, CLASSES, (6,), generator=g)
    if job is HealthyJob.SPARSE:
        return torch.randint(0, VOCAB, (6, 5), generator=g), y
    x = torch.randn(6, FEATURES, generator=g)
    if job is HealthyJob.CHECKPOINT_REENTRANT:
        x.requires_grad_(True)  # a reentrant checkpoint passes gradients only through inputs
    return x, y


def _state(model: nn.Module) -> dict:
    """What must be bitwise the same with the canary on and off."""
    return {"params": {n: p.detach().clone() for n, p in model.named_parameters()},
            "buffers": {n: b.detach().clone() for n, b in model.named_buffers()},
            "rng": torch.get_rng_state()}


def healthy_task(ctx, job: HealthyJob, canary_every: int, steps: int = 4) -> dict:
    """``job`` hardened with the canary every ``canary_every`` steps (0: off): its final state,
    the error it raised (None) and its events."""
    torch.manual_seed(0)
    model = HealthyNet(job)
    ddp = DDP(model)
    state = harden(ddp, SyncConfig(canary_every=canary_every), ctx)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 16) \
        if job is HealthyJob.AMP_FP16 else None
    dtype = {HealthyJob.AMP_FP16: torch.float16, HealthyJob.AMP_BF16: torch.bfloat16}.get(job)
    micros = 3 if job is HealthyJob.ACCUMULATION else 1
    torch.manual_seed(1 + ctx.rank)
    error = None
    try:
        for step in range(steps):
            for micro in range(micros):
                x, y = _batch(job, step, micro, ctx.rank)
                last = micro == micros - 1
                with contextlib.nullcontext() if last else ddp.no_sync(), \
                        torch.autocast("cpu", dtype=dtype or torch.bfloat16,
                                       enabled=dtype is not None):
                    loss = F.cross_entropy(ddp(x), y) / micros
                (scaler.scale(loss) if scaler is not None else loss).backward()
            if scaler is not None:
                scaler.step(opt)
                scaler.update()
            else:
                opt.step()
            opt.zero_grad(set_to_none=True)
    except ConsistencyError as exc:
        error = exc
    return {"job": job.value, **_closed(state, error, model)}


def _closed(state, error: ConsistencyError | None, model: nn.Module) -> dict:
    """Close the guard; what the run raised, its events, the probes run and its final state."""
    events = [e.kind for e in state.events]
    probes = state.canary.probes if state.canary is not None else 0
    state.close(verify=error is None)
    return {"error": error, "events": events, "probes": probes, **_state(model)}


def option_task(ctx, case: matrix.DDPCase, canary_every: int) -> dict:
    """One case of the DDP option matrix hardened (replica slices 1, as the matrix runs it)
    with the canary every ``canary_every`` steps: its final state, error and events."""
    group = matrix._group_for(case, ctx.rank)
    sync = SyncConfig(wire=case.wire, nonfinite="skip" if case.scaler else "raise",
                      replica_slices=1, canary_every=canary_every)
    ddp = matrix._build(case, group)
    state = harden(ddp, sync, ctx)
    torch.manual_seed(1 + ctx.rank)
    error, trained = None, None
    try:
        trained = matrix._train(ddp, case, ctx.rank)
    except ConsistencyError as exc:
        error = exc
    return {"case": case.name, "scales": trained["scales"] if trained else [],
            **_closed(state, error, ddp.module)}


def step_guard_cases() -> list[matrix.DDPCase]:
    """The option matrix's cases the step guard runs (bf16 needs the per-bucket guard)."""
    return [c for c in matrix.CASES if c.wire != "bf16"]


def _equal_states(a: dict, b: dict) -> bool:
    return (all(torch.equal(a[part][n], b[part][n]) for part in ("params", "buffers")
                for n in a[part]) and torch.equal(a["rng"], b["rng"]))


def _alarms(reply: dict) -> int:
    """A raised error and every event are alarms on a healthy job."""
    return int(reply["error"] is not None) + len(reply["events"])


def healthy_pair_task(ctx, job: HealthyJob, steps: int = 4) -> dict:
    """``job`` with the canary off and at every step, on this rank: the alarms of each, the
    probes run and whether the two trained bitwise the same (figures only)."""
    off, on = healthy_task(ctx, job, 0, steps), healthy_task(ctx, job, 1, steps)
    return {"job": job.value, "alarms_off": _alarms(off), "alarms_on": _alarms(on),
            "probes": on["probes"], "bitwise_equal": _equal_states(off, on)}
