"""Silent-data-corruption injectors: one rank's hardware computes some matrix products wrong.

They model HARDWARE, not software: a ``TorchDispatchMode`` entered on the faulty rank corrupts
the float result of the matrix-product ops (``aten.mm``, ``addmm``, ``bmm``, ``baddbmm``)
wherever they run on that rank — the training step's forward and backward, and the compute
canary's probe alike — so no detector can be told where the fault is. Integer products (the
replica digest's) and other ops are untouched.

Each fault (``--inject NAME[=VALUE]@RANK:STEP``, in effect from the forward of STEP on) flips
one bit of element 0 of an op's result:

``sdc-ulp``                 every call, forward and backward: bit 0 (a persistent 1-ulp error);
``sdc-forward``             every forward call only, bit 0;
``sdc-backward``            every backward call only (the local gradient before the reduction),
                            bit 0;
``sdc-flip-low[=0.2]``      a fraction VALUE of backward calls (pseudo-random, seeded by the
                            call count: the same calls every run), bit 3 (low mantissa);
``sdc-flip-high[=0.2]``     the same, bit 30 (the exponent's top bit: a value of magnitude < 2
                            becomes ~1e38 times larger, still finite — no NaN check sees it);
``sdc-flip-exp[=0.2]``      the same, bit 23 (the exponent's lowest bit: the value doubles or
                            halves — training stays finite, and silently wrong);
``sdc-threshold[=1.0]``     every call whose first operand holds an element of magnitude
                            > VALUE, bit 0 (a data-dependent fault: wrong only on some data).

A call is "backward" when it runs inside an autograd node's backward — not merely inside a
graph task: a probe re-run from a callback at the end of the backward is a forward too.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

import torch
from torch.utils._python_dispatch import TorchDispatchMode

SDC_FAULTS: tuple[str, ...] = ("sdc-ulp", "sdc-forward", "sdc-backward", "sdc-flip-low",
                               "sdc-flip-high", "sdc-flip-exp", "sdc-threshold")
SDC_DEFAULTS: dict[str, str] = {"sdc-ulp": "", "sdc-forward": "", "sdc-backward": "",
                                "sdc-flip-low": "0.2", "sdc-flip-high": "0.2",
                                "sdc-flip-exp": "0.2", "sdc-threshold": "1.0"}
_FLIP_BITS = {"sdc-flip-low": 3, "sdc-flip-high": 30, "sdc-flip-exp": 23}
_OPS = frozenset({torch.ops.aten.mm.default, torch.ops.aten.addmm.default,
                  torch.ops.aten.bmm.default, torch.ops.aten.baddbmm.default})
BOTH, FORWARD, BACKWARD = "both", "forward", "backward"


@dataclass(frozen=True)
class SDCModel:
    """What a faulty op does: in which phase, which bit, on what fraction of calls, above
    which input magnitude (None: any)."""

    phase: str = BOTH
    bit: int = 0
    rate: float = 1.0
    threshold: float | None = None


def sdc_model(name: str, value: str) -> SDCModel:
    """The model of fault ``name`` with its VALUE (``ValueError`` for a bad one)."""
    if name in _FLIP_BITS:
        rate = float(value)
        if not 0 < rate <= 1:
            raise ValueError(value)
        return SDCModel(BACKWARD, _FLIP_BITS[name], rate)
    if name == "sdc-threshold":
        t = float(value)
        if not t >= 0:
            raise ValueError(value)
        return SDCModel(BOTH, 0, 1.0, t)
    if value:
        raise ValueError(value)
    return SDCModel({"sdc-forward": FORWARD, "sdc-backward": BACKWARD}.get(name, BOTH))


def _fires(call: int, rate: float) -> bool:
    """Whether call number ``call`` is one of the faulty fraction ``rate`` (a fixed hash)."""
    if rate >= 1.0:
        return True
    h = (call * 0x9E3779B97F4A7C15 + 0x632BE59BD9B4E019) & ((1 << 64) - 1)
    h ^= h >> 31
    return (h * 0xBF58476D1CE4E5B9 & ((1 << 64) - 1)) >> 11 < rate * (1 << 53)


class FaultyMatmul(TorchDispatchMode):
    """The faulty rank's matrix unit (module docstring). ``active`` switches it on (from the
    fault's STEP); ``fired`` counts the corrupted results; ``offset`` starts the call count
    elsewhere (another stretch of the same pseudo-random sequence of faulty calls)."""

    def __init__(self, model: SDCModel, offset: int = 0) -> None:
        super().__init__()
        self.model = model
        self.active = False
        self.calls = offset
        self.fired = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if (not self.active or func not in _OPS or not isinstance(out, torch.Tensor)
                or out.dtype != torch.float32 or out.numel() == 0):
            return out
        backward = torch._C._current_autograd_node() is not None
        if self.model.phase == FORWARD and backward or self.model.phase == BACKWARD \
                and not backward:
            return out
        if self.model.threshold is not None:
            first = args[1] if func in (torch.ops.aten.addmm.default,
                                        torch.ops.aten.baddbmm.default) else args[0]
            if not bool(first.abs().amax() > self.model.threshold):
                return out
        self.calls += 1
        if not _fires(self.calls, self.model.rate):
            return out
        self.fired += 1
        flat = out.view(-1)[:1].view(torch.int32)
        flat ^= 1 << self.model.bit
        return out


def entered(mode: FaultyMatmul | None) -> AbstractContextManager:
    """``mode`` for a ``with`` block on the faulty rank, nothing on a healthy one (None)."""
    return mode if mode is not None else nullcontext()
