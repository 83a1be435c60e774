"""Honest GPU-style non-determinism, emulated on a CPU: the healthy counterpart of
``sdc_faults``.

Kernels that reduce with atomics, or split a reduction differently from run to run, give
results that differ in the last bit from one run to the next, on every rank alike — a healthy
job whose numbers are not reproducible. On a CPU, where every kernel here is deterministic,
``NoisyKernels`` recreates that: with probability ``rate`` per call, a matrix product's result
(``aten.mm``/``addmm``/``bmm``/``baddbmm``: ``F.linear``'s output in the forward, its
grad_input and grad_weight in the backward) gets one random element moved by one ulp (its next
representable value away from zero, in the result's own dtype: fp32, or bf16 under autocast),
drawn from a random stream of the process's own (``seed``: give every rank a different one) —
so two runs of the same computation, or two ranks, differ by rounding-sized amounts at random
places, as reduction order does (~1e-7 relative in fp32).

``phase``: ``both``, ``forward`` (not inside an autograd node) or ``backward`` (inside one, as
``sdc_faults`` decides). Entered as a ``TorchDispatchMode`` around the training loop; ``noised``
counts the results it moved.
"""

from __future__ import annotations

import enum

import torch
from torch.utils._python_dispatch import TorchDispatchMode

_OPS = frozenset({torch.ops.aten.mm.default, torch.ops.aten.addmm.default,
                  torch.ops.aten.bmm.default, torch.ops.aten.baddbmm.default})
# each float dtype's bits as an integer: +1 on them is the next value away from zero
_BITS = {torch.float32: torch.int32, torch.float64: torch.int64, torch.float16: torch.int16,
         torch.bfloat16: torch.int16}


class Phase(enum.StrEnum):
    BOTH = "both"
    FORWARD = "forward"
    BACKWARD = "backward"


class NoisyKernels(TorchDispatchMode):
    """The emulated non-determinism of the module docstring. ``active`` switches it on (a
    test starts it mid-run)."""

    def __init__(self, rate: float, seed: int, phase: Phase = Phase.BOTH,
                 active: bool = True) -> None:
        super().__init__()
        if not 0.0 <= rate <= 1.0:
            raise ValueError(f"rate must be in [0, 1]; got {rate}")
        self.rate, self.phase, self.active = rate, Phase(phase), active
        self.generator = torch.Generator().manual_seed(seed)
        self.noised = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if (not self.active or func not in _OPS or not isinstance(out, torch.Tensor)
                or out.dtype not in _BITS or out.numel() == 0 or not self._in_phase()):
            return out
        if torch.rand((), generator=self.generator).item() >= self.rate:
            return out
        at = int(torch.randint(out.numel(), (), generator=self.generator))
        if not out.is_contiguous():
            return out
        bits = out.view(-1).view(_BITS[out.dtype])
        if torch.isfinite(out.view(-1)[at]):
            bits[at] += 1
            self.noised += 1
        return out

    def _in_phase(self) -> bool:
        backward = torch._C._current_autograd_node() is not None
        return (self.phase is Phase.BOTH or (self.phase is Phase.BACKWARD) == backward)
