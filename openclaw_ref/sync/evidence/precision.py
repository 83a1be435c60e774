"""Wire precision: one power-of-two scale for every rank, divide before the cast, overflow
counted after the allreduce and handled by every rank together.

Order of operations per bucket (the invariant that makes FP16 safe):

    wire = cast(g_local · 2^e / W)      # divide by the world size BEFORE the cast
    wire = SUM over ranks (allreduce)
    g    = float32(wire) · 2^-e

An element therefore overflows on the wire only when the *average* (scaled) exceeds 65504, not
when one rank's local element does — contrast torch's ``fp16_compress_hook``, which casts first
and turns any local |g| ≥ 65520 into inf. Scaling by a power of two is exact; dividing by a
power-of-two W is exact too.

The exponent ``e`` is the same on every rank: fixed (``--scale 4096`` → e = 12, the seed's) or
``auto`` — backed off by one on a step whose *reduced* gradients overflowed and grown by one after
``growth_interval`` clean steps. Both decisions read only the reduced result, which is bitwise
identical on every rank, so the exponent sequence is identical everywhere by construction (and
the control block checks it every bucket anyway). fp32 and bf16 wires go through the same path
with e = 0: bf16 has fp32's exponent range, so it needs no scale, only the per-element rounding.
``ScalePolicy.override`` replaces the exponent on one rank: the fault hook for the seed's M4
(ranks pre-scaling differently), which the control block must catch. It is set on a built
policy only, never through ``SyncConfig``.

The default (``--scale loss-scaler``, ``base.ScaleMode``) defers to a loss scaler: the scaler, if
any, owns the scale and is the judge of overflow, so the wire is PyTorch's ``fp16_compress_hook``
bit for bit — cast to fp16, divide by W in fp16, SUM, copy back — with no pre-scale and no
back-off of its own; an element overflows exactly when it would under that hook, the inf reaches
the scaler as it would there, and ``torch.amp.GradScaler``'s skip/back-off sequence is the one
users know. (Dividing first would overflow *less*, and the scaler's sequence would then differ
from the reference's.) Without a scaler, the overflowed step is skipped by the optimizer
(``ledger`` step 5). The pre-scale (fixed or ``auto``) is opt-in, for jobs with no loss scaler:
under one it multiplies on top of the loss scale, so the wire overflows — and the scaler skips
and backs off — at other steps than under ``fp16_compress_hook`` (``auto`` backing off at the
same time). That combination is refused, not run silently: ``refuse_grad_scaler`` raises
``BadInput`` from the first optimizer step an enabled ``torch.amp.GradScaler`` runs, on every
rank (the scaler's skip decisions read the reduced gradients, the same everywhere), before the
step changes a weight. The earliest sound sign: nothing before the optimizer step tells a
scaled loss from a large one, and a step the scaler skips never calls the optimizer. Another
loss scaler (not ``torch.amp.GradScaler`` or a subclass) is not recognised.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from openclaw_ref.sync.base import ScaleMode, SyncConfig, Wire
from openclaw_ref.sync.errors import BadInput

WIRE_DTYPES: dict[Wire, torch.dtype] = {
    Wire.FP32: torch.float32, Wire.FP16: torch.float16, Wire.BF16: torch.bfloat16,
}  # Wire.NATIVE: each bucket's own gradient dtype (DDP buckets by dtype), never up- or down-cast
MIN_EXP, MAX_EXP = 0, 24
DEFAULT_AUTO_EXP = 12  # the seed's 2^12, the starting point of the dynamic scale
GROWTH_INTERVAL = 100  # clean steps before the dynamic scale doubles


@dataclass
class ScalePolicy:
    """The pre-scale exponent of this run; ``update`` is called once per step on every rank with
    the shared overflow verdict."""

    wire: Wire
    auto: bool
    exponent: int
    per_rank: dict[int, int] = field(default_factory=dict)
    growth_interval: int = GROWTH_INTERVAL
    clean_steps: int = 0
    backoffs: int = 0
    growths: int = 0
    loss_scaler: bool = False  # the wire is fp16_compress_hook's (module docstring)

    @classmethod
    def from_config(cls, cfg: SyncConfig) -> ScalePolicy:
        if cfg.wire is not Wire.FP16:
            return cls(cfg.wire, False, 0)
        if cfg.scale_mode is ScaleMode.LOSS_SCALER:
            return cls(cfg.wire, False, 0, loss_scaler=True)
        if cfg.scale_exp is None:
            return cls(cfg.wire, True, DEFAULT_AUTO_EXP)
        return cls(cfg.wire, False, cfg.scale_exp)

    @property
    def pre_scales(self) -> bool:
        """Does the wire multiply the gradients by 2^e (fixed or ``auto``; module docstring)?"""
        return self.wire is Wire.FP16 and not self.loss_scaler

    def __post_init__(self) -> None:
        # resolved once: dtype_for runs for every bucket, and an enum member lookup is slow
        self._cast = None if self.wire is Wire.NATIVE else WIRE_DTYPES[self.wire]

    def dtype_for(self, grad_dtype: torch.dtype) -> torch.dtype:
        """The wire dtype of a bucket whose gradients are ``grad_dtype``."""
        return grad_dtype if self._cast is None else self._cast

    def override(self, rank: int, exponent: int) -> None:
        """Fault hook: ``rank`` pre-scales by 2^``exponent`` instead of the shared exponent."""
        self.per_rank[rank] = exponent

    def exponent_for(self, rank: int) -> int:
        """This rank's exponent: the shared one, unless the fault hook overrides it."""
        return self.per_rank.get(rank, self.exponent)

    def update(self, overflowed: bool) -> None:
        """Dynamic scale: back off on an overflowed step, grow after N clean ones."""
        if not self.auto:
            return
        if overflowed:
            self.clean_steps = 0
            if self.exponent > MIN_EXP:
                self.exponent -= 1
                self.backoffs += 1
            return
        self.clean_steps += 1
        if self.clean_steps >= self.growth_interval and self.exponent < MAX_EXP:
            self.exponent += 1
            self.growths += 1
            self.clean_steps = 0


GRAD_SCALER_FRAMES = 6  # GradScaler.step → _maybe_opt_step → Optimizer.step's wrapper → hooks


def grad_scaler_running_step() -> bool:
    """Is an enabled ``torch.amp.GradScaler`` running the optimizer step being entered? Read
    from the calling frames (an optimizer step pre-hook runs a few frames below the scaler's
    ``step``); a disabled scaler, or ``optimizer.step()`` called directly, is not one."""
    frame = sys._getframe(1)
    for _ in range(GRAD_SCALER_FRAMES):
        if frame is None:
            return False
        owner = frame.f_locals.get("self")
        if isinstance(owner, torch.amp.GradScaler):
            return owner.is_enabled()
        frame = frame.f_back
    return False


def refuse_grad_scaler(policy: ScalePolicy, scale: str):
    """An optimizer step pre-hook for a pre-scaled fp16 wire (``scale``: its setting): raise
    ``BadInput`` when a ``torch.amp.GradScaler`` runs the step (module docstring)."""

    def hook(optimizer, args, kwargs) -> None:
        if grad_scaler_running_step():
            raise BadInput(
                f"the fp16 wire's pre-scale (scale={scale!r}, now 2^{policy.exponent}) "
                "multiplies on top of torch.amp.GradScaler's loss scale: the scaler would skip "
                "and back off at other steps than under PyTorch's fp16_compress_hook. With a "
                "loss scaler use scale='loss-scaler' (the default), which is that hook exactly")

    return hook


def to_wire(grad: torch.Tensor, out: torch.Tensor, world_size: int, exponent: int,
            cast_first: bool = False) -> None:
    """Write ``grad · 2^exponent / W`` into ``out`` (wire dtype) in ONE pass: the arithmetic is
    done in ``grad``'s precision and rounded once into the wire dtype, so the division by the
    world size happens before the cast. ``cast_first`` (under a loss scaler): cast, then divide
    in the wire dtype, as ``fp16_compress_hook`` does. No non-finite test here: the reduced
    gradients show any NaN/inf (``finite_sum``), and a rank's local gradients are tested only on
    a step where they do (``ledger.Ledger``)."""
    divisor = world_size if exponent == 0 else world_size * 2.0 ** -exponent
    if cast_first:
        out.copy_(grad)
        divide(out, divisor, out=out)
        return
    divide(grad, divisor, out=out)


def divide(t: torch.Tensor, divisor: float, *, out: torch.Tensor) -> torch.Tensor:
    """``torch.div(t, divisor, out=out)`` bit for bit. A power-of-two divisor is applied as a
    multiplication by its reciprocal: scaling by 2^k is exact before the one rounding, so the
    bits (subnormals, NaN and ±inf included) are the division's, and a CPU multiplies a bucket
    about twice as fast as it divides it (1 MB fp32, one thread: 31 vs 75 µs here)."""
    mantissa, _ = math.frexp(divisor)
    if mantissa == 0.5:  # divisor = 2^k: 1/divisor is exact
        return torch.mul(t, 1.0 / divisor, out=out)
    return torch.div(t, divisor, out=out)


def from_wire(reduced: torch.Tensor, exponent: int, dtype: torch.dtype = torch.float32,
              out: torch.Tensor | None = None) -> torch.Tensor:
    """The averaged gradient in ``dtype``: a view of ``reduced`` when nothing needs converting
    (same dtype, e = 0); else written into ``out`` (the hook passes DDP's own bucket buffer, as
    PyTorch's ``fp16_compress_hook`` does, so no bucket-sized temporary lives until DDP copies
    it out), or into a new tensor. Converted first, then unscaled in ``dtype``: a fused
    ``mul(out=)`` would compute in the wire dtype and lose fp16 subnormals to the 2^-e."""
    if reduced.dtype == dtype and exponent == 0:
        return reduced
    if out is None:
        out = reduced.to(dtype)
    else:
        out.copy_(reduced)
    return out.mul_(2.0 ** -exponent) if exponent else out


def finite_sum(t: torch.Tensor) -> torch.Tensor:
    """0-dim float: the sum of ``t``, NaN or ±inf whenever an element is. The cheapest
    non-finite test there is (one streaming pass, half the cost of ``aminmax`` on CPU); a
    finite tensor whose sum overflows also flags, so a flag is confirmed by an exact count.
    Half-precision tensors are summed in fp32 so their own range does not flag."""
    if t.numel() == 0:
        return torch.zeros((), dtype=torch.float32, device=t.device)
    if t.dtype in (torch.float16, torch.bfloat16):
        return t.sum(dtype=torch.float32)
    return t.sum()


def count_nonfinite(t: torch.Tensor | Sequence[torch.Tensor]) -> int:
    """Number of NaN/inf elements of a tensor or of several (a host sync: called only for
    buckets or steps already flagged)."""
    if isinstance(t, torch.Tensor):
        return int(torch.isfinite(t).logical_not().sum())
    return sum(count_nonfinite(x) for x in t)


@dataclass
class OverflowStats:
    """Totals for the run: overflow rate in elements and in steps, and skipped steps."""

    steps: int = 0
    overflowed_steps: int = 0
    skipped_steps: int = 0
    elements: int = 0
    overflow_elements: int = 0

    def add(self, elements: int, overflow_elements: int, skipped: bool) -> None:
        self.steps += 1
        self.elements += elements
        self.overflow_elements += overflow_elements
        self.overflowed_steps += overflow_elements > 0
        self.skipped_steps += skipped

    def to_json(self) -> dict:
        return {
            "steps": self.steps, "skipped_steps": self.skipped_steps,
            "overflowed_steps": self.overflowed_steps,
            "elements": self.elements, "overflow_elements": self.overflow_elements,
            "overflow_rate_elements": (self.overflow_elements / self.elements
                                       if self.elements else 0.0),
            "overflow_rate_steps": self.overflowed_steps / self.steps if self.steps else 0.0,
        }


def nonfinite_flags(sums: list[torch.Tensor], *, each: bool = False
                    ) -> list[bool] | torch.Tensor:
    """A rank's non-finite flag from the sums of its own gradients (``finite_sum``): NaN or
    ±inf iff one gradient is — one flag for all the sums, or with ``each`` one per sum (the
    per-bucket guard's buckets). Read on the host on a CPU (already there, so reading syncs
    nothing); on a device left there, so that no host sync is added: a tensor, non-zero (with
    ``each``: NaN) where a flag is set."""
    if not sums:
        return [False]
    total = torch.stack(sums)
    if total.device.type == "cpu":
        values = [not math.isfinite(v) for v in total.tolist()]
        return values if each else [any(values)]
    if each:
        return total.sub_(total)  # NaN for NaN and ±inf, else 0
    return (~torch.isfinite(total)).any().to(torch.float32).reshape(1)
