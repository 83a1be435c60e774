"""How far the equivalence check lets N ranks end from its reference: one process on the same
global batch for the openclaw model (``checks.py``), stock DDP on the same shards for a user's
target (``oracle.equivalence_tolerance``, which asks bit for bit where every correct average
gives DDP's bits and these wire tolerances elsewhere).

Invariant: every tolerance here is derived, not tuned — by the wire dtype's rounding, or, for
the one approximating strategy (PowerSGD), by the bound below with the one measured figure it
needs named as such.

PowerSGD (``ddp-powersgd``: rank 1, error feedback, compression from step s = 2). With error
feedback each rank keeps e = M − PQᵀ, where M is its gradient plus its previous e; PowerSGD is
linear in the ranks' M (the P and Q allreduces are sums, and the rank-1 orthogonalization only
normalizes), so the applied gradient is ĝ_t = ḡ_t + ē_t − ē_{t+1}, with ē the ranks' average
residual, ē_t = 0 for t ≤ s. Under SGD with momentum β, θ_T = θ_0 − η Σ_t c_t ĝ_t with
c_t = (1 − β^(T−t)) / (1 − β); summing by parts, the parameters end
    θ_T − θ_T(exact) = η (ē_T + Σ_{0<t<T} β^(T−t) ē_t) + (drift: gradients taken at parameters
that already differ, second order in η),
so |Δθ|∞ ≤ η · E · Σ_{k<T−s} β^k, E the largest |ē| element. E is the one measured figure:
2.34 on the tiny openclaw model in the conformance run (2 ranks, 6 steps, global batch 8, SGD
lr 3e-3; measured |Δθ| 0.0166, the bound 0.0213 from each step's own |ē|), taken as
``POWERSGD_RESIDUAL_BOUND`` = 3.0 to leave room for the drift term. A run that does not average
at all (``local``, 2 ranks) ends 0.101 away, about three times outside.
"""

from __future__ import annotations

from openclaw_ref.arms.config import ArmConfig
from openclaw_ref.arms.ddp import POWERSGD_START_ITER
from openclaw_ref.arms.registry import STRATEGIES
from openclaw_ref.core.train import SGD_MOMENTUM
from openclaw_ref.sync.base import Wire

# fp32 differs only by the allreduce's summation order; FP16/BF16 wires round every averaged
# gradient element.
WIRE_ATOL: dict[Wire, float] = {Wire.NATIVE: 1e-5, Wire.FP32: 1e-5, Wire.BF16: 2e-2,
                                Wire.FP16: 5e-3}
POWERSGD = "ddp-powersgd"
POWERSGD_RESIDUAL_BOUND = 3.0  # E above: the measured 2.34, rounded up for the drift term


def powersgd_atol(lr: float, steps: int, momentum: float = SGD_MOMENTUM) -> float:
    """η · E · Σ_{k < steps − s} β^k (see the module docstring)."""
    compressed = max(0, steps - POWERSGD_START_ITER)
    return lr * POWERSGD_RESIDUAL_BOUND * sum(momentum ** k for k in range(compressed))


def wire_of(sync: ArmConfig) -> Wire:
    """The dtype ``sync`` puts on the wire: its ``wire`` setting, or, for a strategy that is
    one of PyTorch's hooks, the hook's own (``hook_wire``: fp16/bf16 compression)."""
    if sync.harden.wire is not Wire.NATIVE:
        return sync.harden.wire
    return getattr(STRATEGIES.get(sync.name), "hook_wire", Wire.NATIVE)


def equivalence_atol(sync: ArmConfig, lr: float, steps: int) -> float:
    """The tolerance on max |Δparam| after ``steps`` SGD steps at ``lr``; PowerSGD's adds its
    bound to the fp32 wire's (its first steps, and its vectors, are plain fp32 allreduces)."""
    if sync.name == POWERSGD:
        return WIRE_ATOL[Wire.FP32] + powersgd_atol(lr, steps)
    return WIRE_ATOL[wire_of(sync)]
