"""Is the compute canary's probe bitwise reproducible where it runs — above all on CUDA, whose
default kernels may be non-deterministic (atomic adds in ``index_add`` and in the backward of
indexing, cuBLAS reduction splits)? The canary confirms every mismatch by re-running the probe
(``sync/canary/verdict.py``), so a non-deterministic kernel switches it to its
tolerance and never raises; these figures say how often that happens on a device, and how far
apart the runs land (what the tolerance, ``canary.tolerance.RTOL``, must absorb), on the MLP and
the ``tiny`` and ``small`` presets:

- ``repeat_task``: the same probe — same parameters, input, seed and cotangent — run many
  times on one rank: how many runs' gradient digests differ from the first run's, the first
  parameter that differed, and the largest distance from the first run
  (``canary.tolerance.distance``: a fraction of the whole probe gradient's mass);
- ``false_alarm_task``: a healthy hardened job (the hook-cost job's ``hardened+canary`` arm: a
  probe every step) over many steps: the ``ConsistencyError`` it raised (none expected), its
  events, whether the canary went to its tolerance — and the repeat figures of the same trained
  model on the same rank, so the two read together.

Device-agnostic (the hook-cost job's models and data, ``hook_cost.step_fn``):
``tests/test_canary_repro.py`` runs both on CPU gloo ranks, ``tests/test_gpu_canary.py`` on
one GPU (``.ci/gpu-canary``). Returns figures only, never an exception object.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch
from torch import nn

from openclaw_ref.experiments.hook_cost import BUCKET_CAP_MB, arm_step, step_fn, wrap_arm
from openclaw_ref.sync.canary.input import capture, rebuild
from openclaw_ref.sync.canary.probe import ProbeResult, run_probe
from openclaw_ref.sync.canary.tolerance import distance
from openclaw_ref.sync.errors import ConsistencyError
from openclaw_ref.sync.evidence.replica_digest import ReplicaDigest

PROBE_SEED = 0x0C1A5  # the canary's seed of its first probe


class ProbeModel(enum.StrEnum):
    """The models of the canary's cost table (``hook_cost``)."""

    MLP = "mlp"
    TINY = "tiny"
    SMALL = "small"


@dataclass
class Repeats:
    """``repeats`` runs of one probe: how many differ from the first bitwise, how many distinct
    results there were, the first parameter that ever differed, and the largest distance from
    the first run (``canary.tolerance.distance``)."""

    repeats: int
    differing: int = 0
    distinct: int = 1
    first_param: str | None = None
    worst_distance: float = 0.0
    digest: str = ""  # the first run's combined digest (hex), to compare across ranks

    def to_json(self) -> dict:
        return asdict(self)


def repeat_probes(module: nn.Module, args: tuple, kwargs: dict, repeats: int,
                  seed: int = PROBE_SEED,
                  probe: Callable[..., ProbeResult] = run_probe) -> Repeats:
    """The canary's probe (``probe``: ``canary.probe.run_probe``) of ``module`` on
    ``(args, kwargs)`` with ``seed``, run ``repeats`` times and compared with the first run."""
    tracked = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
    first = probe(module, tracked, args, kwargs, seed)
    first_row = tuple(first.digest_list())
    rows = {first_row}
    combined = ReplicaDigest.combine_on_host(list(first_row)) & ((1 << 64) - 1)
    out = Repeats(repeats, digest=format(combined, "016x"))
    for _ in range(repeats - 1):
        got = probe(module, tracked, args, kwargs, seed)
        row = tuple(got.digest_list())
        if row == first_row:
            continue
        out.differing += 1
        rows.add(row)
        at = next(j for j, (a, b) in enumerate(zip(row, first_row)) if a != b)
        out.first_param = out.first_param or tracked[at][0]
        out.worst_distance = max(out.worst_distance,
                                 distance(got.figures.tolist(), first.figures.tolist()))
    out.distinct = len(rows)
    return out


def settings() -> dict:
    """The numerics settings the probes ran under (the defaults, unless someone changed them):
    a reproducibility figure means nothing without them."""
    cuda = torch.cuda.is_available()
    return {"deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
            "cudnn_deterministic": torch.backends.cudnn.deterministic,
            "cudnn_benchmark": torch.backends.cudnn.benchmark,
            "matmul_tf32": torch.backends.cuda.matmul.allow_tf32,
            "device_name": torch.cuda.get_device_name(0) if cuda else "cpu",
            "torch": torch.__version__}


def _probe_input(model: str, net: nn.Module, loss: Callable, step: int) -> tuple[tuple, dict]:
    """The probe's input the canary would take from ``loss``'s call at ``step``: its first
    rows, through the canary's own capture and rebuild."""
    seen: list[tuple[tuple, dict]] = []

    def recorder(*args, **kwargs):
        seen.append((args, kwargs))
        return net(*args, **kwargs)

    with torch.no_grad():
        loss(recorder, step)
    noted = capture(*seen[0])
    device = next(net.parameters()).device
    return rebuild(noted, noted.leaves, device)


def repeat_task(ctx, model: str, repeats: int, seed: int = 0) -> dict:
    """``repeats`` probes of ``model`` (fresh, as built by the hook-cost job) on this rank's
    device, on rank 0's input (so every rank's first digest can be compared)."""
    net, loss = step_fn(model, seed, dataclasses.replace(ctx, rank=0))
    args, kwargs = _probe_input(model, net, loss, 0)
    return {"model": model, "rank": ctx.rank, "device": str(ctx.device),
            **repeat_probes(net, args, kwargs, repeats).to_json(), **settings()}


@dataclass(frozen=True)
class FalseAlarmCase:
    """One healthy job: ``model`` hardened with a probe every step for ``steps`` steps, then
    ``repeats`` repeats of one probe on the trained model."""

    model: str = ProbeModel.MLP.value
    steps: int = 100
    repeats: int = 20
    seed: int = 0


def false_alarm_task(ctx, case: FalseAlarmCase) -> dict:
    """The healthy job of ``case`` on this rank: what it raised (None), its events, whether the
    canary went to its tolerance, the probes it ran, then the repeat figures
    of the trained model (module docstring)."""
    net, loss = step_fn(case.model, case.seed, ctx)
    ddp, state = wrap_arm("hardened+canary", net, ctx, BUCKET_CAP_MB[case.model],
                          case.model != ProbeModel.MLP)
    step = arm_step(ddp, state, torch.optim.SGD(ddp.parameters(), lr=1e-3), loss)
    error = None
    try:
        for i in range(case.steps):
            step(i)
    except ConsistencyError as exc:
        error = f"{exc.kind} at step {exc.step}, ranks {list(exc.ranks)}: {exc}"
    finally:
        events = [e.kind for e in state.events]
        tolerant, probes = state.canary.tolerant, state.canary.probes
        steps = state.summary()["steps"]
        state.close(verify=error is None)
    args, kwargs = _probe_input(case.model, ddp.module, loss, case.steps)
    return {"model": case.model, "rank": ctx.rank, "error": error, "events": events,
            "tolerant": tolerant, "probes": probes, "steps": steps,
            "repeats": repeat_probes(ddp.module, args, kwargs, case.repeats).to_json(),
            **settings()}


def stable_or_tolerated(reply: dict) -> bool:
    """The condition a healthy job must meet on every rank: nothing was raised, and its probes
    are bitwise stable or the canary went to its tolerance (the confirmation saw them vary)."""
    return reply["error"] is None and (reply["repeats"]["differing"] == 0 or reply["tolerant"])
