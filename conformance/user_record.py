"""One training run of a user target, recorded once and judged by every check: the state after
each step (parameters and buffers), the buffers each forward started from, the buckets the
user's hook was called with and — on the first ``VALUE_STEPS`` steps — what each bucket held
on this rank before the hook and what the hook returned.

The checks of ``user_checks`` are pure functions of these records, so one run per (model,
hook, DDP option set) serves equivalence, replica consistency, bucket layout and the bucket
average alike, and the stock-DDP run it is compared with is made once per (model, option set).

``compare_states`` is the one comparison of two runs: per step, the largest |Δ| over the
parameters and buffers, where it is, and whether the two are bit for bit equal.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from openclaw_ref.arms.config import ArmConfig
from openclaw_ref.arms.strategy import SyncStrategy
from openclaw_ref.conformance.run_record import RunRecord
from openclaw_ref.conformance.target import TP_WRAPPER, TargetSpec
from openclaw_ref.conformance.user_run import LoopOptions, snapshot, train_reference, train_target
from openclaw_ref.core.callbacks import Callback
from openclaw_ref.core.digests import params_digest, tensor_digest
from openclaw_ref.core.faults import FaultSpec
from openclaw_ref.sync.errors import ConsistencyError

VALUE_STEPS = 2  # steps whose bucket values are kept: before and after DDP's bucket rebuild


class RunRecorder(Callback):
    """Fills a ``RunRecord`` from the loop's hook points. The buffers each step's first forward
    starts from are read by a forward pre-hook on the inner module, i.e. after DDP's broadcast:
    DDP broadcasts at a forward that follows a synchronized backward (so not at the second
    micro-batch of a ``no_sync`` step, whose buffers the first one already moved locally)."""

    def __init__(self, record: RunRecord) -> None:
        self.record = record
        self._strategy: SyncStrategy | None = None
        self._handle: Any = None
        self._first_forward = False

    def setup(self, model: nn.Module, sync: ArmConfig) -> ArmConfig:
        self.record.param_names = tuple(n for n, _ in model.named_parameters())
        self._handle = model.register_forward_pre_hook(self._forward)
        return sync

    def _forward(self, module: nn.Module, args: Any) -> None:
        if not self._first_forward:
            return
        self._first_forward = False
        buffers = [(n, b) for n, b in module.named_buffers()]
        if buffers:
            self.record.step_buffers.append(params_digest(buffers))

    def on_wrapped(self, strategy: SyncStrategy) -> None:
        self._strategy = strategy
        self.record.hooked = self._hook() is not None

    def _hook(self):
        return getattr(self._strategy, "recorder", None)

    def before_forward(self, step: int, model: nn.Module) -> None:
        self._first_forward = True
        if step == 0:
            self.record.start = snapshot(model)
        recorder = self._hook()
        if recorder is not None:
            recorder.keep_values = step < VALUE_STEPS

    def before_sync(self, step: int, model: nn.Module, strategy: SyncStrategy) -> None:
        recorder = self._hook()
        if recorder is None:
            return
        self.record.layouts.append(recorder.take())
        values = recorder.take_values()
        if step < VALUE_STEPS:
            self.record.buckets.append([(i, _cpu(a), _cpu(b)) for i, a, b in values])
        recorder.keep_values = False

    def after_step(self, step: int, model: nn.Module) -> None:
        state = snapshot(model)
        self.record.states.append(state)
        self.record.param_digests.append(
            tuple(tensor_digest(state[n]) for n in self.record.param_names))

    def close(self) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None


def _cpu(t: torch.Tensor) -> torch.Tensor:
    return t.to("cpu")


def record_run(ctx, spec: TargetSpec, options: LoopOptions, faults: tuple[FaultSpec, ...] = (),
               one_process: bool = False) -> RunRecord:
    """A rank task: train ``spec`` under ``options`` and return this rank's ``RunRecord``. A
    ``ConsistencyError`` (a hook's own check firing) ends the run into the record; any other
    error propagates (the pool names the rank). ``one_process``: rank 0 also trains one
    process on the global batch from the state DDP started from. Under ``--openclaw-wrapper
    fsdp2``/``hsdp`` the run is ``fsdp_run.record_fsdp_run`` (``options``: an ``FsdpOptions``),
    under ``fsdp2-tp`` ``tp_run.record_tp_run`` (a ``TpOptions``; no one-process run)."""
    if spec.wrapper == TP_WRAPPER:
        from openclaw_ref.conformance.tp_run import record_tp_run

        return record_tp_run(ctx, spec, options)
    if spec.wrapper != "ddp":
        from openclaw_ref.conformance.fsdp_run import record_fsdp_run

        return record_fsdp_run(ctx, spec, options, one_process)
    record = RunRecord(ctx.rank, hooked=False)
    try:
        train_target(ctx, spec, options, faults, [RunRecorder(record)])
    except ConsistencyError as exc:
        record.error, record.error_text = exc.event().to_json(), str(exc)
    if one_process and ctx.rank == 0 and record.start:
        record.one_process = train_reference(spec, options, ctx.world_size, record.start)
    return record


def record_task(ctx, spec: TargetSpec, options: LoopOptions, one_process: bool = False) -> bytes:
    """``record_run`` as a rank-pool task: the record comes back as ``torch.save`` bytes. A
    pool pipe would otherwise pass every tensor storage as a file descriptor, and a record
    holds hundreds of tensors (the parent ran out of descriptors)."""
    buffer = io.BytesIO()
    torch.save(record_run(ctx, spec, options, one_process=one_process), buffer)
    return buffer.getvalue()


def unpack(payload: bytes) -> RunRecord:
    """A ``record_task`` reply (bytes this process's own rank pool sent)."""
    return torch.load(io.BytesIO(payload), weights_only=False)


@dataclass(frozen=True)
class StepDiff:
    """Two runs after one step on one rank: the largest |Δ| over parameters and floating
    buffers (integer buffers count their difference too), where, and whether every tensor is
    bit for bit equal."""

    step: int
    diff: float
    name: str
    bitwise: bool


def compare_states(a: list[dict[str, torch.Tensor]],
                   b: list[dict[str, torch.Tensor]]) -> list[StepDiff]:
    """Step by step over the steps both runs have."""
    return [_compare(step, x, y) for step, (x, y) in enumerate(zip(a, b))]


def _compare(step: int, x: dict[str, torch.Tensor], y: dict[str, torch.Tensor]) -> StepDiff:
    worst, where, bitwise = 0.0, "", True
    for name, t in x.items():
        other = y[name]
        if torch.equal(t, other):
            continue
        bitwise = False
        diff = float((t.double() - other.double()).abs().max())
        if worst == worst and not diff <= worst:  # a NaN, once found, stays the worst
            worst, where = diff, name
    return StepDiff(step, worst, where, bitwise)
