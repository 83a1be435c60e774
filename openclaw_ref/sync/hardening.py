"""``harden(model)``: the one entry point of the hook library, whatever the wrapper.

It picks the adapter for the wrapper it is handed, each built on the same evidence
(``evidence/``: the per-step exchange's blocks, ledger, replica digest, watchdog, errors):

- ``DistributedDataParallel``: ``ddp.step_guard`` (``Guard.STEP``, the default: DDP's own C++
  reduction and one small exchange per step) or ``ddp.bucket_guard`` (``Guard.BUCKET``: a
  per-bucket comm hook, the forensic mode);
- an FSDP2 module (``fully_shard`` on a 1-D mesh, HSDP's 2-D mesh, or
  ``replicate_with_fsdp``'s replicate mesh): ``fsdp.guard``;
- a module given to the composable ``replicate()`` (DDP inside): ``ddp.replicate``.

Invariant: every refusal (``BadInput``) comes before anything is registered and before any
collective, so a refused ``harden()`` leaves the user's model exactly as it was.

Invariant: hardening a DDP or ``replicate()`` model imports nothing of FSDP2 — neither
``fsdp/`` here nor torch's ``torch.distributed.fsdp`` (whose private ``_fully_shard`` modules
``fsdp/hooks.py`` names). A model is FSDP2 only if ``fully_shard`` made it, which has imported
``torch.distributed.fsdp`` already, so the check reads ``sys.modules`` and the FSDP2 adapter is
imported only then: a DDP user's torch need not have FSDP2 at all
(``tests/test_torch_floor.py``).
"""

from __future__ import annotations

import dataclasses
import os
import sys
import warnings
from typing import TYPE_CHECKING

import torch
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.optim.optimizer import register_optimizer_step_pre_hook
from torch.torch_version import TorchVersion

from openclaw_ref.sync.base import CANARY_EVERY, Guard, RankInfo, SyncConfig
from openclaw_ref.sync.ddp.bucket_guard import harden_buckets
from openclaw_ref.sync.ddp.replicate import replicate_state, replicated
from openclaw_ref.sync.ddp.step_guard import StepGuard
from openclaw_ref.sync.ddp.step_setup import refuse_unsupported, register_wire
from openclaw_ref.sync.errors import BadInput, Event
from openclaw_ref.sync.evidence import checks
from openclaw_ref.sync.guard import GuardBase
from openclaw_ref.sync.target import bucket_sizes, refuse_later_comm_hooks, validate_target

CANARY_OFF = "CanaryOff"  # Event kind: the default-on canary cannot run on this model (why)
# the oldest torch the FSDP2 adapter (fsdp/) is tested on: tox -e torch-floor-fsdp2
FSDP2_FLOOR = (2, 12)

if TYPE_CHECKING:
    from torch.distributed.fsdp import FSDPModule



def harden(ddp_model: DDP | FSDPModule, cfg: SyncConfig | None = None,
           ctx: RankInfo | None = None, *, optimizer: torch.optim.Optimizer | None = None
           ) -> GuardBase:
    """Make a DDP model's gradient sync verifiable; returns the state (see module docstring).
    An FSDP2 (``fully_shard``) root module gets ``fsdp.guard``'s guard (``optimizer``: its own).

    ``cfg.guard`` picks how: ``step`` (the default, ``step_guard``: DDP's own C++ reduction and
    one small exchange per step) or ``bucket`` (this module's per-bucket comm hook: the
    forensic mode, and the only one that pre-scales an fp16 wire or sends bf16). Everything
    runs on ``ddp_model.process_group``. ``ctx`` (any ``RankInfo``, e.g. our launcher's) gives
    the store for the watchdog and the way to report a hang from its thread; without it the
    default store and ``os._exit`` are used. Raises ``BadInput`` before registering anything and
    before any collective when the model cannot be hardened: a comm hook already registered
    (Python or C++ built-in), a DDP model built for compiled autograd
    (``optimize_ddp="python_reducer"``: ``target.refuse_python_reducer``), a process group with
    no backend for the gradients' device, a wire dtype the backend cannot reduce, a wire or
    pre-scale the chosen guard cannot send; and from the first optimizer step a
    ``torch.amp.GradScaler`` runs over a pre-scaled fp16 wire (``precision.refuse_grad_scaler``).

    ``state.close()`` removes what this added (forward hooks, gradient-presence hooks, the
    optimizer step pre-hooks, the watchdog thread) on the rank it runs on. Under ``bucket``
    DDP cannot unregister the comm hook: after ``close()`` it is inert — a plain allreduce
    average like PyTorch's ``allreduce_hook``, no control block, no check — so close every
    rank of the group. Under ``step`` the wire is DDP's own and stays as it was.

    After an error. Under ``bucket`` a ``ConsistencyError`` (or a failed collective) is raised
    from inside DDP's backward, which leaves DDP's reducer mid-iteration: the next backward of
    this DDP model fails on DDP's own internal assert. Under ``step`` the verdict is read after
    DDP's finalize, so the DDP model stays usable — unless a rank's DDP did not reduce every
    bucket (``MissingGradient``, ``GradientsNotAveraged``), which leaves that rank's reducer
    mid-iteration. Either way the one recipe (``docs/errors.md``, tested by
    ``tests/test_harden_recovery.py``): close the state and drop the model (its reducer's hooks
    on the parameters go with it), then either build a new ``DistributedDataParallel`` around
    the same module (its parameters are broadcast from rank 0 again) and harden that, or
    restore a checkpoint — on every rank.
    """
    cfg = cfg or SyncConfig()
    if is_fsdp2(ddp_model):
        refuse_old_fsdp2(torch.__version__)
    by_default = cfg.canary_every is None
    every, canary_off = canary_interval(ddp_model, cfg)
    cfg = dataclasses.replace(cfg, canary_every=every)
    if is_fsdp2(ddp_model):
        from openclaw_ref.sync.fsdp.canary import fsdp_canary_for
        from openclaw_ref.sync.fsdp.guard import harden_fsdp

        guard = harden_fsdp(ddp_model, cfg, optimizer, ctx)
        guard.canary = fsdp_canary_for(guard, every)
        guard.canary_off = canary_off
        if by_default and canary_off:
            guard.events.append(Event(CANARY_OFF, None, detail=canary_off))
        return guard
    if replicate_state(ddp_model) is not None and cfg.guard is not Guard.STEP:
        raise BadInput("a module given to replicate() takes the step guard only (the per-bucket "
                       "guard watches DDP.forward, which replicate() never calls)")
    inner = replicated(ddp_model)  # replicate()'s DDP, built now if its first forward has not run
    if inner is not None:
        ddp_model = inner.ddp
    backend = validate_target(ddp_model, cfg)
    if cfg.guard is Guard.STEP:
        refuse_unsupported(cfg)
    group = ddp_model.process_group
    module = inner.module if inner is not None else ddp_model.module
    named = inner.named if inner is not None else list(module.named_parameters())
    checks.construction_check(named, group=group, layout=bucket_sizes(ddp_model))
    synchronized = named if inner is not None else checks.synchronized_parameters(ddp_model)
    if cfg.guard is Guard.STEP:
        state = StepGuard(ddp_model, cfg, named, synchronized,
                          module=inner.module if inner is not None else None)
        state.watch(ctx)
        register_wire(ddp_model, cfg)
        state.install(checks.required_gradient_names(module))
    else:
        state = harden_buckets(ddp_model, cfg, ctx, named,
                               synchronized)
    state.ledger.count_check(True)
    state.canary_off = canary_off
    state.handles.extend(refuse_later_comm_hooks(ddp_model))
    state.mark(ddp_model, module)
    state.handles.append(register_optimizer_step_pre_hook(state.before_optimizer_step))
    if backend == "nccl" and os.environ.get(
            "TORCH_NCCL_ASYNC_ERROR_HANDLING") is None:
        warnings.warn("TORCH_NCCL_ASYNC_ERROR_HANDLING was not set before the NCCL process group "
                      "was created; a failed collective may hang instead of aborting",
                      stacklevel=2)
    return state


def canary_interval(model: DDP | FSDPModule, cfg: SyncConfig) -> tuple[int, str]:
    """The compute canary's interval for ``model`` — ``cfg.canary_every``, or by default
    ``CANARY_EVERY`` where the canary can run — and, when it is 0, why (for ``summary()``).
    The canary runs under the step guard only (DDP's, ``replicate()``'s, FSDP2's and HSDP's),
    and on FSDP2 only where it can hide FSDP2's own forward hooks: asked for explicitly
    elsewhere, ``BadInput`` (silently unprotected would be worse than refused); by default it
    is off there, and ``summary()`` says so."""
    asked = cfg.canary_every
    if asked == 0:
        return 0, "off: canary_every=0"
    tp = _tensor_parallel_dims(model) if is_fsdp2(model) else ()
    if tp:
        if asked is None:
            return 0, (f"off: tensor parallel (mesh dims {', '.join(tp)}): the probe runs the "
                       "model on plain tensors, which a module sharded by a TP plan cannot take")
        raise BadInput(f"the compute canary (canary_every) does not run on a tensor-parallel "
                       f"model (mesh dims {', '.join(tp)}): its probe runs the model on plain "
                       "tensors, which a module sharded by a TP plan cannot take; pass "
                       "canary_every=0")
    if is_fsdp2(model) and not _fsdp_hooks_found(model):
        if asked is None:
            return 0, "off: FSDP2's forward hooks are not where this torch keeps them"
        raise BadInput("the compute canary (canary_every) cannot hide FSDP2's own forward hooks "
                       "in this torch (their handles are not where torch 2.13 keeps them), and "
                       "a probe through them would change training: pass canary_every=0")
    if cfg.guard is not Guard.STEP:
        if asked is None:
            return 0, "off: the per-bucket guard has no canary"
        raise BadInput("the compute canary (canary_every) runs under the step guard only; "
                       "pass guard='step' or canary_every=0")
    return (CANARY_EVERY if asked is None else asked), ""


def is_fsdp2(model: object) -> bool:
    """Is ``model`` an FSDP2 module (``fully_shard``, HSDP, ``replicate_with_fsdp``)? Read
    without importing anything (module docstring): no ``torch.distributed.fsdp`` loaded, or
    one without ``FSDPModule`` (torch before FSDP2 was public), means it cannot be."""
    fsdp = sys.modules.get("torch.distributed.fsdp")
    cls = getattr(fsdp, "FSDPModule", None)
    return isinstance(cls, type) and isinstance(model, cls)


def refuse_old_fsdp2(version: str) -> None:
    """The FSDP2 adapter reads FSDP2's internals (its param groups, its custom comm types),
    which moved between releases: before ``FSDP2_FLOOR`` — the oldest torch whose FSDP2 tests
    pass (README's tested versions) — it would fail deep inside with an ``AttributeError``, so
    ``BadInput`` says so first. DDP's floor is the package's (pyproject)."""
    if TorchVersion(version) < ".".join(map(str, FSDP2_FLOOR)):
        raise BadInput(f"harden() guards FSDP2 from torch {FSDP2_FLOOR[0]}.{FSDP2_FLOOR[1]} "
                       f"(the oldest it is tested on); this is torch {version}: upgrade torch, "
                       "or wrap the model in DistributedDataParallel, which harden() guards on "
                       "this torch")


def _tensor_parallel_dims(model: FSDPModule) -> tuple[str, ...]:
    """``fsdp/mesh.py``'s mesh dims FSDP2 does not own (tp), imported only for an FSDP2
    model."""
    from openclaw_ref.sync.fsdp.mesh import tensor_parallel_dims

    return tensor_parallel_dims(model)


def _fsdp_hooks_found(model: FSDPModule) -> bool:
    """``fsdp/canary.py``'s check that FSDP2 keeps its forward hooks' handles where the probe
    can hide them, imported only for an FSDP2 model."""
    from openclaw_ref.sync.fsdp.canary import hooks_found

    return hooks_found(model)
