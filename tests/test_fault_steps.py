"""``--inject FAULT@RANK:STEP`` never ignores STEP: every fault of the registry either has its
first effect at STEP or is refused when parsed (exit 2 before any process starts).

The effect is read on one process: the injector drives a tiny model through the loop's hook
points beside a fault-free twin, and the first step at which the two differ — a sleep or an exit
asked for, a gradient, the pre-scale exponent, a parameter after the optimizer step — is where
the fault acted. One multi-process run shows the same for a check's event."""

from __future__ import annotations

import types

import pytest
import torch
import torch.nn.functional as F

from openclaw_ref.arms.config import ArmConfig
from openclaw_ref.core import faults
from openclaw_ref.core.data import DataConfig, SkillDataset, rank_batch
from openclaw_ref.core.errors import RankFailed
from openclaw_ref.core.faults import FAULTS, FaultInjector, FaultSpec, parse_fault
from openclaw_ref.core.model import build_model, preset
from openclaw_ref.sync.base import SyncConfig
from openclaw_ref.sync.errors import BadInput, ScaleMismatch
from openclaw_ref.sync.evidence.precision import ScalePolicy
from tests.helpers import record_of, train_cfg

STEP = 3
STEPS = 5
PRESCALED = ArmConfig.of("bucketed", wire="fp16", scale="4096")  # a wire with a pre-scale


class _Exited(Exception):
    """What ``os._exit`` raises here, so the crash fault's step can be read."""


class _Strategy:
    """The strategy as the injector sees it: a name, and a pre-scale policy or none."""

    def __init__(self, sync: SyncConfig, prescaled: bool) -> None:
        self.name = sync.name
        self.policy = ScalePolicy.from_config(sync.harden) if prescaled else None

    def scale_policy(self) -> ScalePolicy | None:
        return self.policy


def _trace(spec: FaultSpec | None, prescaled: bool, monkeypatch) -> list[list]:
    """Per step, what rank 1 of 2 asked for and held under ``spec`` (None: no fault)."""
    asked: list[str] = []
    monkeypatch.setattr(faults, "time", types.SimpleNamespace(
        sleep=lambda s: asked.append(f"sleep {s}")))

    def exit_(code: int) -> None:
        raise _Exited(code)

    monkeypatch.setattr(faults, "os", types.SimpleNamespace(_exit=exit_))
    torch.manual_seed(0)
    cfg = preset("tiny")
    model, ds = build_model(cfg), SkillDataset(cfg, DataConfig())
    injector = FaultInjector((spec,) if spec else (), rank=1, world_size=2)
    sync = injector.setup(model, PRESCALED if prescaled else ArmConfig.of("ddp"))
    strategy = _Strategy(sync, prescaled)
    injector.on_wrapped(strategy)  # type: ignore[arg-type]
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    trace: list[list] = []
    for step in range(STEPS):
        batch = rank_batch(ds, step, 8, 1, 2)
        try:
            injector.before_forward(step, model)
            loss = F.cross_entropy(model(batch.tokens, batch.sample_ids, step), batch.labels)
            injector.before_backward(step, model)
        except _Exited as exc:
            trace.append([f"exit {exc}"])
            break
        loss.backward()
        grads = [None if p.grad is None else p.grad.clone() for p in model.parameters()]
        injector.after_sync(step, model, strategy, True)  # type: ignore[arg-type]
        opt.step()
        opt.zero_grad(set_to_none=True)
        injector.after_step(step, model)
        exponent = strategy.policy.exponent_for(1) if strategy.policy else None
        trace.append([list(asked), exponent, grads, [p.detach().clone() for p in
                                                     model.parameters()]])
        asked.clear()
    return trace


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)
                and torch.equal(a, b))
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def first_effect(spec: FaultSpec, prescaled: bool, monkeypatch) -> int | None:
    """The first step at which rank 1 under ``spec`` differs from its fault-free twin (one
    thread: a tiny model's steps cost ~50 ms then, and seconds on a shared, loaded CPU)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        clean = _trace(None, prescaled, monkeypatch)
        faulty = _trace(spec, prescaled, monkeypatch)
    finally:
        torch.set_num_threads(threads)
    return next((s for s, (a, b) in enumerate(zip(clean, faulty)) if not _same(a, b)), None)


# every fault on a wire without a pre-scale; the one that a pre-scale takes, on one with it too
CASES = [(name, False) for name in FAULTS] + [("scale-mismatch", True)]


@pytest.mark.parametrize("name,prescaled", CASES,
                         ids=[f"{n}{'-pre-scaled' if p else ''}" for n, p in CASES])
def test_every_fault_acts_first_at_its_step_or_refuses_the_step(name, prescaled, monkeypatch):
    try:
        spec = parse_fault(f"{name}@1:{STEP}")
    except BadInput as exc:
        assert name in str(exc) and f":{STEP}" in str(exc) and "step 0" in str(exc)
        return
    assert first_effect(spec, prescaled, monkeypatch) == STEP


@pytest.mark.parametrize("name", sorted(faults.CONSTRUCTION_TIME))
def test_a_construction_time_fault_takes_no_step_or_step_0(name):
    assert parse_fault(f"{name}@1").effective_step() == 0
    assert parse_fault(f"{name}@1:0").effective_step() == 0


def test_a_refused_step_exits_2_before_any_rank_starts(capsys):
    from openclaw_ref.cli import main

    assert main(["train", "--no-progress", "--inject", "local-buckets@1:3"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "local-buckets" in err[0] and ":3" in err[0]


def test_a_pre_scale_mismatch_is_reported_at_its_step_not_at_step_0(pools):
    cfg = train_cfg(2, PRESCALED, steps=STEPS, global_batch=8,
                    faults=(parse_fault(f"scale-mismatch@1:{STEP}"),))
    with pytest.raises(RankFailed) as info:
        pools.get(2).run(record_of, cfg)
    assert isinstance(info.value.cause, ScaleMismatch)
    assert info.value.cause.step == STEP and info.value.cause.ranks == [0, 1]  # no majority
