"""Fault injectors: reproduce each failure mode of the seed on demand, on a named rank and step.

CLI syntax: ``--inject NAME[=VALUE][@RANK][:STEP]`` (repeatable). The training loop calls the
injector at fixed points; a fault acts only on its rank. Defaults: rank = the last rank, step = 2.
Invariant: a fault's first effect is at its STEP, or the parser refuses the STEP (the
construction-time faults, ``CONSTRUCTION_TIME``, take only ``:0`` or none) — a STEP is never
silently ignored.

The injector is a loop callback (``core/callbacks.py``); the hook points it uses:
  ``setup(model, sync)``      reorders the model's registration and may change this rank's
                              ArmConfig (before the strategy is built)
  ``on_wrapped``              overrides this rank's pre-scale on the strategy's scale policy
  ``before_forward``, ``before_backward``
  ``after_sync``              after the strategy's ``finish_step``, before the optimizer step
  ``after_step``              after the optimizer step

The faults (VALUE in brackets, with its default):

``late-rank[=5.7ms]``      sleeps before the backward of STEP (one-shot): the rank's buckets become
                           ready Δt late (the seed's M1; 5.7 ms is its upper bound). Units ms/s/us.
``local-buckets[=0.05]``   the seed's rank-local bucketing: under ``bucketed`` the rank plans with
                           ``norm-ema`` on its own local norms; under DDP-based strategies the rank
                           gets bucket cap VALUE MB, so its bucket layout differs from the others'.
                           Construction-time: in effect from step 0 (a STEP other than 0 is
                           refused).
``scale-mismatch[=10]``    the rank pre-scales FP16 gradients by 2^VALUE while the others use the
                           configured scale (2^12, the seed's M4). Strategies with a pre-scale
                           get it on their scale policy from the forward of STEP on. Stock DDP
                           and harden()'s step guard have none, so it is simulated from STEP
                           on: the rank multiplies its local gradients by 2^(VALUE-12) before
                           the allreduce and divides the averaged result by the same factor
                           after it ("unscaling by its own factor"):
                           what two ranks with different pre-scales compute. Under AdamW the
                           replicas then differ in the last bits (Adam is nearly scale-free).
``missing-grad[=layer.3.attn.v_proj.weight]``  at STEP the parameter takes no part in autograd on
                           the rank (``grad`` stays None; nothing zero-fills it here).
``permuted-params[=layer.3.attn.q_proj,layer.3.attn.v_proj]``  two same-shaped submodules swap
                           their registration order on the rank, so two pairs of same-shaped
                           parameters (weight, bias) swap positions in ``parameters()``.
                           Construction-time (a STEP other than 0 is refused).
``bitflip[=layer.5.ffn.w1.weight]``  after the optimizer step of STEP, bit 22 (the top mantissa bit:
                           the value stays finite) of element 0 of the parameter is flipped.
``nan-grad[=layer.3.attn.v_proj.weight]``  at STEP element 0 of the rank's local gradient of the
                           parameter becomes NaN before it enters any allreduce.
``crash[=13]``             the rank leaves with ``os._exit(VALUE)`` just before the backward of
                           STEP.
``hang[=3600s]``           the rank sleeps VALUE just before the backward of STEP: it stops
                           participating far past every deadline.

The silent-data-corruption faults (``sdc_faults.SDC_FAULTS``: ``sdc-ulp``, ``sdc-forward``,
``sdc-backward``, ``sdc-flip-low``, ``sdc-flip-high``, ``sdc-flip-exp``, ``sdc-threshold``)
model the rank's hardware computing matrix products wrong from the forward of STEP on,
wherever they run (see ``sdc_faults``). They are parsed here like every fault, but are not
columns of the fault matrix (``FAULTS``): their corpus is ``experiments/sdc_corpus.py``.
"""

from __future__ import annotations

import dataclasses
import os
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from openclaw_ref.arms.config import ArmConfig
from openclaw_ref.arms.strategy import PreScale, SyncStrategy
from openclaw_ref.core.callbacks import Callback
from openclaw_ref.core.sdc_faults import SDC_DEFAULTS, SDC_FAULTS, FaultyMatmul, sdc_model
from openclaw_ref.sync.base import ScaleMode
from openclaw_ref.sync.errors import BadInput

FAULTS: tuple[str, ...] = ("late-rank", "local-buckets", "scale-mismatch", "missing-grad",
                           "permuted-params", "bitflip", "nan-grad", "crash", "hang")
DEFAULT_VALUES: dict[str, str] = {
    "late-rank": "5.7ms",
    "local-buckets": "0.05",
    "scale-mismatch": "10",
    "missing-grad": "layer.3.attn.v_proj.weight",
    "permuted-params": "layer.3.attn.q_proj,layer.3.attn.v_proj",
    "bitflip": "layer.5.ffn.w1.weight",
    "nan-grad": "layer.3.attn.v_proj.weight",
    "crash": "13",
    "hang": "3600s",
    **SDC_DEFAULTS,
}
KNOWN_FAULTS: tuple[str, ...] = FAULTS + SDC_FAULTS  # what ``--inject`` accepts
# Faults that stop the process group for good: a test needs a fresh group after one of them.
GROUP_KILLING: frozenset[str] = frozenset({"crash", "hang"})
# Faults applied at construction, in effect from step 0 whatever STEP says.
CONSTRUCTION_TIME: frozenset[str] = frozenset({"local-buckets", "permuted-params"})
# Strategies whose FP16 pre-scale policy takes the fault (``SyncStrategy.scale_policy``).
PRESCALING_STRATEGIES: frozenset[str] = frozenset({"hardened", "bucketed"})
# Strategies built on torch DDP (bucket layout set by ``bucket_cap_mb``).
DDP_STRATEGIES: frozenset[str] = frozenset({"ddp", "ddp-allreduce", "ddp-fp16", "ddp-bf16",
                                             "ddp-powersgd", "hardened", "seed-f5"})
BITFLIP_BIT = 22
DEFAULT_SCALE_EXPONENT = 12

_SPEC = re.compile(r"^(?P<name>[a-z0-9-]+)(=(?P<value>[^@:]+))?(@(?P<rank>\d+))?(:(?P<step>\d+))?$")
_DURATION = re.compile(r"^(?P<num>\d+(\.\d*)?|\.\d+)\s*(?P<unit>us|ms|s)?$")
_UNIT_S = {"us": 1e-6, "ms": 1e-3, "s": 1.0, None: 1e-3}  # a bare number is milliseconds


@dataclass(frozen=True)
class FaultSpec:
    name: str
    rank: int | None = None  # None: the last rank
    step: int = 2
    value: str | None = None

    def target_rank(self, world_size: int) -> int:
        return world_size - 1 if self.rank is None else self.rank

    @property
    def resolved_value(self) -> str:
        return self.value if self.value is not None else DEFAULT_VALUES[self.name]

    def effective_step(self) -> int:
        """The first step at which the fault is in effect (construction-time faults: 0)."""
        if self.name in CONSTRUCTION_TIME:
            return 0
        return self.step

    def target_params(self) -> list[str]:
        """The parameter names a correct detector should name (empty: rank-level fault)."""
        if self.name in ("missing-grad", "nan-grad", "bitflip"):
            return [self.resolved_value]
        if self.name == "permuted-params":
            return [f"{m}.{p}" for m in self.resolved_value.split(",") for p in ("weight", "bias")]
        return []


def parse_duration_s(text: str) -> float:
    """``5.7ms``, ``2s``, ``300us`` or a bare number of milliseconds → seconds (0 < s ≤ 1 day)."""
    m = _DURATION.match(text.strip())
    if not m:
        raise BadInput(f"bad duration {text!r}; expected e.g. 5.7ms, 2s or 300us")
    seconds = float(m["num"]) * _UNIT_S[m["unit"]]
    if not 0 < seconds <= 86400:
        raise BadInput(f"duration {text!r} must be positive and at most one day")
    return seconds


def _check_value(spec: FaultSpec) -> None:
    """Reject a VALUE that cannot work, before any process starts."""
    v = spec.resolved_value
    try:
        if spec.name in ("late-rank", "hang"):
            parse_duration_s(v)
        elif spec.name == "local-buckets":
            if float(v) <= 0:
                raise ValueError
        elif spec.name == "scale-mismatch":
            if not 0 <= int(v) <= 24:
                raise ValueError
        elif spec.name == "crash":
            if not 1 <= int(v) <= 255:
                raise ValueError
        elif spec.name == "permuted-params":
            if len([m for m in v.split(",") if m]) != 2:
                raise ValueError
        elif spec.name in SDC_FAULTS:
            sdc_model(spec.name, v)
    except ValueError:
        raise BadInput(f"bad value {v!r} for fault {spec.name}") from None


def _check_step(name: str, step: int) -> None:
    """Refuse a STEP the fault cannot honour: a construction-time fault is in effect from step 0
    whatever STEP says, and a run reporting it at step 0 after ``:3`` was asked misleads."""
    if name in CONSTRUCTION_TIME and step != 0:
        raise BadInput(f"fault {name} acts when the model is built (in effect from step 0), so "
                       f":{step} cannot be honoured; leave out :STEP (or give :0)")


def fault_text(name: str, value: str | None, step: int) -> str:
    """The ``--inject`` text of fault ``name`` at ``step``; a construction-time fault gets no
    STEP (it acts when the model is built, and ``parse_fault`` refuses any other than 0)."""
    when = "" if name in CONSTRUCTION_TIME else f":{step}"
    return f"{name}{'=' + value if value else ''}{when}"


def parse_fault(text: str) -> FaultSpec:
    """Parse ``NAME[=VALUE][@RANK][:STEP]``; unknown names list the known ones, a STEP the
    fault cannot honour is refused (module docstring)."""
    m = _SPEC.match(text.strip())
    if not m:
        raise BadInput(f"bad --inject {text!r}; expected NAME[=VALUE][@RANK][:STEP]")
    if m["name"] not in KNOWN_FAULTS:
        raise BadInput(f"unknown fault {m['name']!r}; choose one of {', '.join(KNOWN_FAULTS)}")
    if m["step"]:
        _check_step(m["name"], int(m["step"]))
    spec = FaultSpec(m["name"], int(m["rank"]) if m["rank"] else None,
                     int(m["step"]) if m["step"] else 2, m["value"])
    _check_value(spec)
    return spec


def validate_faults(specs: tuple[FaultSpec, ...], world_size: int, steps: int) -> None:
    for s in specs:
        if s.rank is not None and not 0 <= s.rank < world_size:
            raise BadInput(f"fault {s.name}@{s.rank}: rank outside 0..{world_size - 1}")
        if s.step >= steps:
            raise BadInput(f"fault {s.name}:{s.step}: step outside 0..{steps - 1}")


def _named_param(model: nn.Module, name: str) -> nn.Parameter:
    params = dict(model.named_parameters())
    if name not in params:
        raise BadInput(f"fault target {name!r} is not a parameter of the model")
    return params[name]


def swap_submodules(model: nn.Module, first: str, second: str) -> None:
    """Swap the registration order of two sibling submodules (their names stay; only the order
    of ``parameters()`` changes). They must have the same parameter shapes."""
    parent_a, _, leaf_a = first.rpartition(".")
    parent_b, _, leaf_b = second.rpartition(".")
    if parent_a != parent_b:
        raise BadInput(f"permuted-params: {first} and {second} must be siblings")
    parent = model.get_submodule(parent_a) if parent_a else model
    a, b = parent.get_submodule(leaf_a), parent.get_submodule(leaf_b)
    if [p.shape for p in a.parameters()] != [p.shape for p in b.parameters()]:
        raise BadInput(f"permuted-params: {first} and {second} differ in parameter shapes")
    order = list(parent._modules.items())
    i, j = [k for k, (n, _) in enumerate(order) if n in (leaf_a, leaf_b)]
    order[i], order[j] = order[j], order[i]
    parent._modules.clear()
    parent._modules.update(order)


def flip_bit_(t: torch.Tensor, index: int = 0, bit: int = BITFLIP_BIT) -> None:
    """Flip one bit of one float32 element in place."""
    with torch.no_grad():
        flat = t.detach().view(-1)
        as_int = flat[index:index + 1].view(torch.int32)
        as_int ^= (1 << bit)


class FaultInjector(Callback):
    """Applies the faults aimed at this rank; a no-op when there are none."""

    def __init__(self, specs: tuple[FaultSpec, ...], rank: int, world_size: int) -> None:
        self.specs = specs
        self.rank = rank
        self.world_size = world_size
        self.mine = [s for s in specs if s.target_rank(world_size) == rank]
        self.strategy = "?"
        self._handles: list = []  # tensor hooks removed after the step they act on
        self._restore: list[Callable[[], None]] = []
        self._unscale: float | None = None  # stock-DDP scale-mismatch: divide synced grads
        self._prescaled = False  # the strategy's own pre-scale takes the scale fault
        self._policy: PreScale | None = None
        self._base_exponent = DEFAULT_SCALE_EXPONENT
        self._sdc: list[tuple[FaultSpec, FaultyMatmul]] = []  # entered by ``setup``

    def _active(self, name: str, step: int | None = None) -> list[FaultSpec]:
        return [s for s in self.mine if s.name == name and (step is None or s.step == step)]

    def setup(self, model: nn.Module, sync: ArmConfig) -> ArmConfig:
        for s in self.mine:  # this rank's faulty hardware, on from the fault's STEP, to close()
            if s.name in SDC_FAULTS:
                self._sdc.append((s, FaultyMatmul(sdc_model(s.name, s.resolved_value))))
                self._sdc[-1][1].__enter__()
        for s in self._active("permuted-params"):
            first, second = s.resolved_value.split(",")
            swap_submodules(model, first.strip(), second.strip())
        return self._sync_config(sync)

    def _sync_config(self, cfg: ArmConfig) -> ArmConfig:
        self.strategy = cfg.name
        # the others' pre-scale the fault departs from: a fixed one as configured, else the
        # seed's 2^12
        harden = cfg.harden
        self._base_exponent = (harden.scale_exp if harden.scale_mode is ScaleMode.FIXED
                               else DEFAULT_SCALE_EXPONENT)
        for s in self._active("local-buckets"):
            if cfg.name == "bucketed":
                cfg = dataclasses.replace(cfg, planner="norm-ema")
            else:
                cfg = dataclasses.replace(cfg, bucket_cap_mb=float(s.resolved_value))
        return cfg

    def on_wrapped(self, strategy: SyncStrategy) -> None:
        policy = strategy.scale_policy() if strategy.name in PRESCALING_STRATEGIES else None
        self._prescaled = policy is not None
        self._policy = policy

    def before_forward(self, step: int, model: nn.Module) -> None:
        for s, mode in self._sdc:
            mode.active = step >= s.step
        if self._policy is not None:  # from STEP on, this rank's pre-scale departs
            for s in self._active("scale-mismatch", step):
                self._policy.override(self.rank, int(s.resolved_value))
        for s in self._active("missing-grad", step):
            p = _named_param(model, s.resolved_value)
            p.requires_grad_(False)  # autograd leaves it out: no gradient at all on this rank
            self._restore.append(lambda p=p: p.requires_grad_(True))

    def before_backward(self, step: int, model: nn.Module) -> None:
        for s in self._active("nan-grad", step):
            self._handles.append(_named_param(model, s.resolved_value).register_hook(_poison_nan))
        if not self._prescaled:  # no pre-scale to take the fault (stock DDP, the step guard)
            for s in self.mine:
                if s.name == "scale-mismatch" and step >= s.step:
                    factor = 2.0 ** (int(s.resolved_value) - self._base_exponent)
                    self._unscale = factor
                    for p in model.parameters():
                        if p.requires_grad:
                            self._handles.append(p.register_hook(_scaler(factor)))
        for s in self._active("late-rank", step):
            time.sleep(parse_duration_s(s.resolved_value))
        for s in self._active("crash", step):
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(int(s.resolved_value))
        for s in self._active("hang", step):
            time.sleep(parse_duration_s(s.resolved_value))

    def after_sync(self, step: int, model: nn.Module, strategy: SyncStrategy,
                   applied: bool) -> None:
        if self._unscale is not None:
            with torch.no_grad():
                for p in model.parameters():
                    if p.grad is not None:
                        p.grad.div_(self._unscale)
            self._unscale = None

    def after_step(self, step: int, model: nn.Module) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()
        for restore in self._restore:
            restore()
        self._restore.clear()
        for s in self._active("bitflip", step):
            flip_bit_(_named_param(model, s.resolved_value))

    def close(self) -> None:
        for _, mode in reversed(self._sdc):
            mode.__exit__(None, None, None)
        self._sdc.clear()


def _poison_nan(grad: torch.Tensor) -> torch.Tensor:
    grad = grad.clone()
    grad.view(-1)[0] = float("nan")
    return grad


def _scaler(factor: float) -> Callable[[torch.Tensor], torch.Tensor]:
    def hook(grad: torch.Tensor) -> torch.Tensor:
        return grad * factor
    return hook
