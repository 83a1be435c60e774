"""What ``harden()`` is configured with: ``SyncConfig`` (its knobs, and only its knobs), the enums
its fields take, and ``RankInfo`` (what it may be told about the rank it runs on). The benchmark's
own strategies and their config live beside the library, in ``openclaw_ref.arms``."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from functools import cached_property
from typing import Protocol, TypeVar

import torch
import torch.distributed as dist

from openclaw_ref.sync.errors import BadInput


class Wire(enum.StrEnum):
    """What a bucket travels as: its gradients' own dtype, or a cast to fp32/fp16/bf16."""

    NATIVE = "native"
    FP32 = "fp32"
    FP16 = "fp16"
    BF16 = "bf16"


class NonFinitePolicy(enum.StrEnum):
    """What a rank's local NaN/inf gradient does: every rank skips the step together (what a
    loss scaler such as torch.amp.GradScaler expects), or ``NonFiniteGradient`` is raised."""

    SKIP = "skip"
    RAISE = "raise"


class Guard(enum.StrEnum):
    """How ``harden()`` gathers its evidence.

    ``STEP`` (the default): the gradients go through DDP's own C++ reduction (no Python comm
    hook; DDP's built-in C++ hook for an fp16 wire), and everything the guard checks — clock,
    what was averaged, missing gradients, each rank's non-finite flag, the ready-time skew, one
    replica slice's digest — rides in ONE small allreduce per step, issued at the end of the
    backward, before DDP waits for its last bucket. ``BUCKET``: the forensic mode — a Python
    comm hook that checks every bucket (its membership, its ready-time skew, which rank's
    bucket held a NaN) and can pre-scale an fp16 wire or send bf16; it costs a Python call per
    bucket (``docs/hardening.md`` states both costs)."""

    STEP = "step"
    BUCKET = "bucket"


class VerdictAt(enum.StrEnum):
    """Where ``harden()`` reads a step's verdict on the host — its one host synchronization.

    ``BACKWARD``: at the end of the backward that issued the step's last bucket (where DDP
    queues its finalize), so an error is raised from ``backward()``. ``OPTIMIZER_STEP``: the
    backward stays stream-ordered (on CUDA no host sync inside it, which keeps CPU/GPU overlap
    and CUDA-graph capture possible); the verdict is read where the user's code next enters the
    hook library — the optimizer step (a pre-hook: an error is raised from ``optimizer.step()``
    before it applies anything), ``finish_step``, ``begin_step`` or the next forward. ``AUTO``
    (the default): ``BACKWARD`` on a CPU, where there is no stream to keep ordered,
    ``OPTIMIZER_STEP`` when the parameters are on CUDA."""

    AUTO = "auto"
    BACKWARD = "backward"
    OPTIMIZER_STEP = "optimizer-step"


class WatchdogAction(enum.StrEnum):
    """What the watchdog does once a collective has waited ``watchdog_s`` for late ranks.

    Every action first records the diagnosis (an event in ``events``, and a warning): which
    ranks have not reached the collective and what each is doing — alive between steps (a
    checkpoint save, an evaluation), or silent (no heartbeat: frozen, dead or cut off).

    ``RAISE`` (the default) never kills and never interrupts: when the training thread next
    enters the hook library (the end-of-backward check, ``begin_step``, ``finish_step``, the
    next forward) and the collective has failed (the process group's ``timeout``, a peer that
    died) or is still waiting on a silent rank, it raises ``SyncTimeout`` there, with the
    diagnosis — an exception the job can catch (to save a checkpoint) instead of the backend's
    bare timeout. A collective that completes — the late rank arrived — raises nothing.
    ``REPORT`` only records. ``EXIT`` ends the process with exit code 4 from the watchdog's
    thread at the deadline, whatever the late ranks are doing (jobs that prefer to die).

    Under ``RAISE`` and ``EXIT`` the watchdog's thread also ends the process when the job has
    failed elsewhere (``evidence/job_end.py``: a peer's failure note, or the store's host
    gone: ``JobFailed``) or when an FSDP2 collective past the deadline is explained by its
    guard's notes (``evidence/outside_work.py``): the training thread could never leave it."""

    RAISE = "raise"
    REPORT = "report"
    EXIT = "exit"


class ScaleMode(enum.StrEnum):
    """Who owns the fp16 wire's scale. ``loss-scaler`` (the default): nobody on the wire — it
    is PyTorch's ``fp16_compress_hook`` exactly (cast, ÷W, no pre-scale, no back-off of its
    own), so ``torch.amp.GradScaler`` skips and backs off identically, and without a scaler an
    overflowed step is skipped by every rank's optimizer (``ledger`` step 5). A fixed 2^e or our
    dynamic one (``auto``) is opt-in, for jobs with NO loss scaler: it would multiply on top of
    a loss scale (double scaling, ``auto`` backing off when the scaler does), so under an
    enabled ``torch.amp.GradScaler`` it is refused with ``BadInput`` at the first optimizer step
    the scaler runs (``precision.refuse_grad_scaler``). Why not detect a scaler and pick:
    nothing the hook sees before the optimizer step tells a scaled loss from a large one, so the
    default is the mode that is right both with and without one."""

    FIXED = "fixed"
    AUTO = "auto"
    LOSS_SCALER = "loss-scaler"


_Choice = TypeVar("_Choice", bound=enum.StrEnum)


def as_choice(kind: type[_Choice], value: str, flag: str) -> _Choice:
    """``value`` (a member, or the string the CLI and users pass) as a member of ``kind``;
    ``BadInput`` naming ``--flag`` and the choices otherwise."""
    try:
        return kind(value)
    except ValueError:
        raise BadInput(f"--{flag} must be one of {', '.join(kind)}; got {value!r}") from None


def parse_scale(scale: str) -> tuple[ScaleMode, int | None]:
    """``--scale``: the mode and the exponent e of the pre-scale 2^e (None under "auto",
    dynamic; 0 under "loss-scaler")."""
    if scale == ScaleMode.AUTO:
        return ScaleMode.AUTO, None
    if scale == ScaleMode.LOSS_SCALER:
        return ScaleMode.LOSS_SCALER, 0
    try:
        value = int(scale)
    except ValueError:
        value = 0
    if value < 1 or value & (value - 1):
        raise BadInput(f"--scale must be a power of two, 'auto' or 'loss-scaler'; got {scale!r}")
    return ScaleMode.FIXED, value.bit_length() - 1


class RankInfo(Protocol):
    """What ``harden()`` may be told about the rank it runs on (its ``ctx``; the benchmark's
    strategies are told the same). The launcher's ``RankContext`` implements it; so can any
    user's object (the hook library never imports the launcher)."""

    rank: int
    world_size: int
    backend: str
    device: torch.device
    store: dist.Store  # heartbeats of the watchdog

    def report_fatal(self, exc: BaseException) -> None:
        """Report ``exc`` as this rank's failure from any thread and end the process."""


@dataclass(frozen=True)
class SyncConfig:
    """The knobs of ``harden()``, every one read by it (``docs/reference.md``: one row each).

    ``wire``, ``nonfinite``, ``watchdog_action``, ``verdict_at`` and ``guard`` accept their enum
    or its string (as the CLI passes it) and always hold the enum; ``scale`` keeps the text it
    was given (the run JSON records it), ``scale_mode`` and ``scale_exp`` are its parsed value."""

    wire: Wire = Wire.NATIVE
    # "loss-scaler" (no pre-scale, the default), a power of two or "auto" (see ScaleMode)
    scale: str = ScaleMode.LOSS_SCALER.value
    # the synchronized parameters are cut into K slices, one digested per step in the step's
    # control block, so every parameter is compared every K steps, and all of them once more at
    # close(): a divergence is caught within K (16) steps, or at close() for the rest; 0 = off
    replica_slices: int = 16
    watchdog_s: float = 60.0  # a bucket's allreduce older than this names the late ranks
    watchdog_action: WatchdogAction = WatchdogAction.RAISE
    nonfinite: NonFinitePolicy = NonFinitePolicy.SKIP
    verdict_at: VerdictAt = VerdictAt.AUTO  # where the step's verdict is read
    guard: Guard = Guard.STEP  # one exchange per step, or the per-bucket hook
    # the compute canary (``canary.schedule``, docs/canary.md): every K steps each rank runs the
    # same small probe and the ranks' results are compared; names a rank whose hardware
    # computes wrong gradients. None (the default): ``CANARY_EVERY`` wherever the canary can
    # run (the step guard on DDP, replicate(), FSDP2/HSDP), off elsewhere (the per-bucket
    # guard), said in ``summary()``; K > 0: every K steps, refused where it cannot run; 0: off
    canary_every: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "wire", as_choice(Wire, self.wire, "wire"))
        object.__setattr__(self, "nonfinite",
                           as_choice(NonFinitePolicy, self.nonfinite, "nonfinite"))
        object.__setattr__(self, "watchdog_action",
                           as_choice(WatchdogAction, self.watchdog_action, "watchdog-action"))
        object.__setattr__(self, "verdict_at", as_choice(VerdictAt, self.verdict_at, "verdict-at"))
        object.__setattr__(self, "guard", as_choice(Guard, self.guard, "guard"))
        _ = self.scale_exp  # parsed here, so a bad --scale fails at construction
        if self.replica_slices < 0:
            raise BadInput("replica slices must be >= 0 (0 = off)")
        if self.canary_every is not None and self.canary_every < 0:
            raise BadInput("canary interval must be >= 0 (0 = off)")
        if self.watchdog_s <= 0:
            raise BadInput("watchdog deadline must be positive")

    @cached_property
    def scale_mode(self) -> ScaleMode:
        return parse_scale(self.scale)[0]

    @cached_property
    def scale_exp(self) -> int | None:
        """The fixed pre-scale's exponent (``--scale 4096`` → 12; 0 under "loss-scaler"); None
        under "auto"."""
        return parse_scale(self.scale)[1]


# ``SyncConfig.canary_every``'s default: a probe costs about one small step (measured in
# docs/canary.md), so every 256 steps keeps the canary's amortized cost under 1 % of a step on
# the benchmark models (asv's HookCost canary ratio)
CANARY_EVERY = 256
