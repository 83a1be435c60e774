"""The oracle a user's hook is judged against: stock DDP — the same model, shards, seeds and DDP
options, with no comm hook — and how close a hook must come to it.

Why stock DDP and not one process on the global batch: DDP averages the gradients of per-shard
losses; it never runs the global batch. For a model whose forward treats every sample alone the
two agree, but BatchNorm in training mode, in-batch negatives, a load-balancing loss over the
local tokens or a branch taken on the batch make N ranks of *any* correct DDP differ from one
process. One-process equivalence is therefore measured as a property of the model
(``shard_invariance``), reported in its own row, and never fails a hook.

How close (``equivalence_tolerance``, measured on torch 2.13, gloo):
  - bit for bit at 2 ranks on the gradients' own dtype (wire ``native``, or ``fp32`` with fp32
    gradients). Stock DDP multiplies each rank's gradient by 1/W and sums; at W = 2 every
    correct average gives the same bits (a + b = b + a, and halving is exact barring
    subnormals): PyTorch's ``allreduce_hook``, a sum-then-divide hook and ``harden()`` measured
    bitwise on every zoo model.
  - at 3+ ranks the fp32 tolerance (``WIRE_ATOL``, 1e-5): ÷3 and ×(1/3) round differently
    (``allreduce_hook`` ends 3e-8 from stock DDP at W = 3), and gloo's summation order depends
    on the buffer's length (``harden()``, whose last bucket also carries its control block,
    ends 6e-8 away at W = 4);
  - fp16 / bf16 wires: the wire's tolerance (5e-3 / 2e-2).
If stock DDP does not reproduce itself (a second run differs: a nondeterministic kernel), the
bitwise claim is dropped and the oracle's own spread is added to the tolerance.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from openclaw_ref.conformance.run_record import RunRecord
from openclaw_ref.conformance.settings import CheckResult, Role
from openclaw_ref.conformance.target import TargetSpec
from openclaw_ref.conformance.tolerance import WIRE_ATOL
from openclaw_ref.conformance.user_record import StepDiff, compare_states, record_task, unpack
from openclaw_ref.conformance.user_run import LoopOptions
from openclaw_ref.core.errors import LaunchTimeout, RankFailed
from openclaw_ref.core.launch import RankPool
from openclaw_ref.sync.base import Wire

STOCK_DDP = "stock DDP"
STOCK_WRAPPER = {"ddp": STOCK_DDP, "fsdp2": "stock FSDP2", "hsdp": "stock HSDP",
                 "fsdp2-tp": "stock FSDP2 x TP"}
RUN_TIMEOUT_S = 180.0


@dataclass(frozen=True)
class Tolerance:
    """How far (max |Δ| over parameters and buffers, any step, any rank) a hook may end from
    stock DDP; ``atol`` 0 means bit for bit. ``why`` says which rule applied."""

    atol: float
    why: str

    @property
    def bitwise(self) -> bool:
        return self.atol == 0.0

    def exceeded(self, diff: StepDiff) -> bool:
        return not diff.bitwise if self.bitwise else not diff.diff <= self.atol


def equivalence_tolerance(wire: Wire, world_size: int, fp32_grads: bool,
                          noise: float, same_collectives: bool = False) -> Tolerance:
    """The rule of the module docstring. ``same_collectives``: the subject runs the oracle's
    own collectives (``harden()`` on FSDP2 leaves its reduction untouched), so bit for bit at
    any world size on the gradients' own dtype."""
    own_dtype = wire is Wire.NATIVE or (wire is Wire.FP32 and fp32_grads)
    if same_collectives and own_dtype and noise == 0:
        return Tolerance(0.0, "bit for bit: the subject wraps the stock wrapper's own "
                              "collectives, at any world size")
    if noise > 0:
        atol = WIRE_ATOL[wire] + noise
        return Tolerance(atol, f"stock DDP differs from itself by {noise:.3g} between two "
                               f"runs: the {wire} wire's {WIRE_ATOL[wire]:g} plus that spread")
    if own_dtype and world_size == 2:
        return Tolerance(0.0, "bit for bit: at 2 ranks every correct average of the gradients' "
                              "own dtype gives stock DDP's bits")
    return Tolerance(WIRE_ATOL[wire], f"the {wire} wire's rounding at {world_size} ranks")


def max_diff(diffs: list[list[StepDiff]]) -> float:
    return max((d.diff for per_rank in diffs for d in per_rank), default=0.0)


def shard_invariance(reference: RunRecord, world_size: int, model: str,
                     oracle: str = STOCK_DDP) -> CheckResult:
    """Rank 0 of stock DDP against one process on the global batch (parameters after the last
    step): a property of the model, reported, never a failure. Tolerance: the fp32 wire's."""
    atol = WIRE_ATOL[Wire.FP32]
    final = reference.states[-1] if reference.states else {}
    one = reference.one_process or {}
    names = [n for n in reference.param_names if n in final and n in one]
    diff, where = max(((float((final[n].double() - one[n].double()).abs().max()), n)
                       for n in names), default=(0.0, ""))
    invariant = diff <= atol
    figures = {"model": model, "shard_invariant": invariant, "max_abs_param_diff": diff,
               "param": where,
               "atol": atol, "world_size": world_size, "steps": len(reference.states)}
    if invariant:
        detail = (f"this model is shard-invariant: {world_size} ranks of {oracle} equal one "
                  f"process on the global batch within {atol:g} (max |Δ| {diff:.3g})")
    else:
        detail = (f"this model is not shard-invariant: {oracle} differs from one process by "
                  f"{diff:.3g} in {where!r}; hooks are judged against {oracle}")
    return CheckResult("shard invariance (model property)", oracle, True, detail, figures,
                       role=Role.PROPERTY)


@dataclass
class Oracle:
    """Stock DDP on one (model, DDP option set): ``runs`` (per rank, rank 0 also ran one
    process on the global batch) and ``again``, a second identical run (its spread from the
    first is the oracle's own noise). ``error``: stock DDP itself failed here."""

    runs: list[RunRecord] | None
    again: list[RunRecord] | None
    error: str = ""

    def noise(self) -> list[list[StepDiff]]:
        return [compare_states(a.states, b.states) for a, b in zip(self.again, self.runs)]

    def fp32_grads(self) -> bool:
        import torch

        start = self.runs[0].start
        return all(start[n].dtype == torch.float32 for n in self.runs[0].param_names)


@dataclass
class Runs:
    """One spec's run on every rank (``records``), or why it stopped (``failure``: the pool's
    error naming the rank)."""

    records: list[RunRecord] | None
    failure: str = ""


class TargetRuns:
    """The runs the checks judge, each made once per session: stock DDP per (model, world size,
    option set, bucket cap) — twice, for its noise — and each hook's run per (model, hook,
    world size, option set, bucket cap), on the shared pools (``get_pool(world_size)``)."""

    def __init__(self, get_pool: Callable[[int], RankPool]) -> None:
        self._get_pool = get_pool
        self._oracles: dict[tuple, Oracle] = {}
        self._runs: dict[tuple, Runs] = {}

    def oracle(self, spec: TargetSpec, options: LoopOptions) -> Oracle:
        stock = replace(spec, hook=None, wire="native")
        key = (stock.factory, spec.wrapper, spec.world_size, options)
        if key not in self._oracles:
            first = self._run(stock, options, one_process=True)
            again = self._run(stock, options) if first.records else first
            self._oracles[key] = Oracle(first.records, again.records,
                                        first.failure or again.failure)
        return self._oracles[key]

    def runs(self, spec: TargetSpec, options: LoopOptions) -> Runs:
        """The hook's run; stock DDP's (no hook) is the oracle's second run."""
        if spec.hook is None:
            oracle = self.oracle(spec, options)
            return Runs(oracle.again, oracle.error)
        key = (spec.factory, spec.wrapper, spec.hook, spec.world_size, options)
        if key not in self._runs:
            self._runs[key] = self._run(spec, options)
        return self._runs[key]

    def _run(self, spec: TargetSpec, options: LoopOptions, one_process: bool = False) -> Runs:
        try:
            replies = self._get_pool(spec.world_size).run(
                record_task, spec, options, one_process, timeout_s=RUN_TIMEOUT_S)
            return Runs([unpack(r) for r in replies])
        except (RankFailed, LaunchTimeout) as exc:
            return Runs(None, str(exc).splitlines()[0])
