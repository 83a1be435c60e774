"""The compute canary's tolerance, measured: how far apart honest non-determinism puts two runs
of the same probe, beside how small a fault the tolerance still sees.

For each model — the test zoo's (``conformance.zoo.models``), the canary's confirmation net
and the benchmark's MLP and ``tiny`` preset — in fp32 and under bf16 autocast, on one process:

- **healthy**: the probe run once clean and ``trials`` times under the emulated GPU noise at its
  worst (``core.nondeterminism``: EVERY matrix product of the forward and the backward moved
  by one ulp at a random element, a fresh random stream per trial); the largest distance
  (``canary.tolerance.distance``: the largest figure difference over the whole probe
  gradient's mass) from the clean run;
- **faulty**: the probe with element 0 of every matrix product scaled by (1 + 2^-j), for
  j = 1 … 24; the smallest such error whose distance exceeds ``RTOL`` — the smallest fault of
  that kind the tolerance still catches.

The tolerance is justified when the healthy column stays far below ``RTOL`` on every row.
``tests/test_canary_noise.py`` holds that; ``openclaw-bench canary-noise`` prints the table that
``docs/canary.md`` publishes. Figures only.
"""

from __future__ import annotations

import contextlib
import enum
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from openclaw_ref.core.nondeterminism import NoisyKernels
from openclaw_ref.sync.canary.input import capture, rebuild
from openclaw_ref.sync.canary.probe import ProbeResult, run_probe
from openclaw_ref.sync.canary.tolerance import distance, tolerance

_OPS = frozenset({torch.ops.aten.mm.default, torch.ops.aten.addmm.default,
                  torch.ops.aten.bmm.default, torch.ops.aten.baddbmm.default})
EXPONENTS = tuple(range(1, 25))  # faults: element 0 scaled by 1 + 2^-j
SEED = 0x0C1A5


class Precision(enum.StrEnum):
    FP32 = "fp32"
    BF16 = "bf16 autocast"


class ScaledElement(TorchDispatchMode):
    """A persistent fault: element 0 of every matrix product's result times ``factor``."""

    def __init__(self, factor: float) -> None:
        super().__init__()
        self.factor = factor

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func in _OPS and isinstance(out, torch.Tensor) and out.numel():
            out.view(-1)[:1] *= self.factor
        return out


@dataclass
class NoiseRow:
    """One model at one precision: the worst healthy distance over ``trials`` noisy runs, the
    smallest fault caught (its 2^-j and its distance; None when no j in ``EXPONENTS`` is)."""

    model: str
    precision: str
    trials: int
    healthy: float | None
    smallest_caught: float | None
    caught_distance: float | None
    rtol: float = 0.0
    skipped: str = ""  # why the model cannot run at this precision (its own error)

    def to_json(self) -> dict:
        return asdict(self)


def _zoo(name: str) -> tuple[nn.Module, tuple, dict]:
    from openclaw_ref.conformance.zoo import models

    target = getattr(models, name)()
    inputs, _ = target.batch(0, 0, 2)
    args = inputs if isinstance(inputs, tuple) else (inputs,)
    noted = capture(args, {})
    return target.module, *rebuild(noted, noted.leaves, torch.device("cpu"))


def _confirm_net() -> tuple[nn.Module, tuple, dict]:
    from openclaw_ref.experiments.canary_confirm import ConfirmNet, confirm_batch

    torch.manual_seed(0)
    noted = capture((confirm_batch(0, 0)[0],), {})
    return ConfirmNet(), *rebuild(noted, noted.leaves, torch.device("cpu"))


def _bench(model: str) -> tuple[nn.Module, tuple, dict]:
    from openclaw_ref.experiments.canary_repro import _probe_input
    from openclaw_ref.experiments.hook_cost import step_fn

    class _Ctx:
        rank, world_size, device = 0, 2, torch.device("cpu")

    net, loss = step_fn(model, 0, _Ctx())
    return net, *_probe_input(model, net, loss, 0)


MODELS: dict[str, Callable[[], tuple[nn.Module, tuple, dict]]] = {
    **{name: (lambda n=name: _zoo(n)) for name in (
        "batchnorm_cnn", "tied_lm", "branching", "frozen_layers", "sparse_embedding",
        "moe_router", "contrastive")},
    "confirm_net": _confirm_net,
    "mlp": lambda: _bench("mlp"),
    "tiny": lambda: _bench("tiny"),
}


def noise_row(model: str, precision: Precision, trials: int = 20) -> NoiseRow:
    """The measurement of the module docstring for one model and precision."""
    net, args, kwargs = MODELS[model]()
    tracked = [(n, p) for n, p in net.named_parameters() if p.requires_grad]

    def probe(mode: TorchDispatchMode | None = None) -> ProbeResult:
        autocast = (torch.autocast("cpu", dtype=torch.bfloat16) if precision is Precision.BF16
                    else contextlib.nullcontext())
        with autocast, mode if mode is not None else contextlib.nullcontext():
            return run_probe(net, tracked, args, kwargs, SEED)

    try:
        clean = probe()
    except RuntimeError as exc:  # the model itself does not run so (not the canary's doing)
        return NoiseRow(model, precision.value, 0, None, None, None,
                        skipped=f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}")
    rtol = tolerance(clean.low_precision)
    figures = clean.figures.tolist()

    def far(mode: TorchDispatchMode) -> float:
        return distance(probe(mode).figures.tolist(), figures)

    healthy = max(far(NoisyKernels(1.0, seed=t)) for t in range(trials))
    caught = next(((2.0 ** -j, d) for j in sorted(EXPONENTS, reverse=True)
                   if (d := far(ScaledElement(1 + 2.0 ** -j))) > rtol), (None, None))
    return NoiseRow(model, precision.value, trials, healthy, *caught, rtol=rtol)


def noise_table(trials: int = 20) -> list[dict]:
    """Every model at both precisions."""
    return [noise_row(m, p, trials).to_json() for m in MODELS for p in Precision]
