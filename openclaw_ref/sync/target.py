"""What ``harden()`` accepts: the DDP model it is handed, checked before anything is registered,
and the facts about it the construction check compares (DDP's bucket layout). Also the one
reader of the NCCL version (``core.environment`` formats it for the run record and the doctor)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from openclaw_ref.sync.attached import MISSING, Unset
from openclaw_ref.sync.base import Guard, SyncConfig, Wire
from openclaw_ref.sync.errors import BadInput
from openclaw_ref.sync.evidence.precision import WIRE_DTYPES

if TYPE_CHECKING:  # FSDP2's names only where an FSDP2 module is checked (hardening.py)
    from torch.distributed.fsdp import FSDPModule

HARDENED_MARK = "_openclaw_guard"  # set on a DDP model while a harden() state guards it


def bucket_sizes(ddp_model: DDP) -> list[int] | None:
    """DDP's bucket sizes in bytes (fixed at construction with find_unused_parameters=True;
    otherwise rebuilt once after the first iteration and broadcast from rank 0 by DDP)."""
    try:
        raw = ddp_model._get_ddp_logging_data().get("bucket_sizes", "")
    except Exception:  # a private API: a missing layout only weakens the check
        return None
    return [int(x) for x in str(raw).split(",") if x.strip()]


def reducible_dtypes(backend: str, nccl_version: tuple[int, ...] | None = None
                     ) -> set[torch.dtype] | None:
    """Floating dtypes ``backend`` can SUM-allreduce (None: unknown backend, not checked).
    bf16 needs NCCL 2.10; gloo reduces all four on CPU (its bf16 is why a bf16 wire works on
    gloo although PyTorch's ``bf16_compress_hook`` refuses CPU)."""
    common = {torch.float16, torch.float32, torch.float64}
    if backend == "gloo":
        return common | {torch.bfloat16}
    if backend == "nccl":
        return common | ({torch.bfloat16} if nccl_version and nccl_version >= (2, 10) else set())
    return None


def nccl_version() -> tuple[int, ...] | None:
    """The NCCL version this torch was built with, e.g. ``(2, 21, 5)``; None without CUDA or
    NCCL."""
    if not torch.cuda.is_available():
        return None
    try:
        v = torch.cuda.nccl.version()
    except Exception:
        return None
    return tuple(v) if isinstance(v, tuple) else None


def registered_hook(ddp_model: DDP) -> str | None:
    """The name of the comm hook already registered on ``ddp_model`` (a Python hook, or a C++
    built-in one, which DDP records only in its logging data), None when there is none."""
    hooks = getattr(ddp_model, "_comm_hooks", None)
    if hooks:
        return getattr(hooks[0][0], "__qualname__", repr(hooks[0][0]))
    try:
        name = ddp_model._get_ddp_logging_data().get("comm_hook")
    except Exception:  # a private API; a Python hook is still caught above
        return None
    return str(name) if name else None


def refuse_later_comm_hooks(ddp_model: DDP) -> list[Unset]:
    """While hardened, DDP's ``register_comm_hook`` and ``_register_builtin_comm_hook`` raise
    ``BadInput`` before DDP records anything: the refusal of a hook registered before
    ``harden()`` (``validate_target``), in the other order — ``harden()`` cannot guard a wire it
    does not own, and DDP takes one hook (the per-bucket guard's or the fp16 wire's own). As
    instance attributes, whose handles ``close()`` removes (then DDP's own methods answer)."""
    def refuse(*args: object, **kwargs: object) -> None:
        raise BadInput("this DDP model is hardened, and harden() cannot guard a comm hook it "
                       "does not own: register no hook (for an fp16 wire, "
                       "SyncConfig(wire='fp16') sends DDP's built-in one), or close() the "
                       "guard first to train with your hook unguarded")

    handles = []
    for name in ("register_comm_hook", "_register_builtin_comm_hook"):
        handles.append(Unset(ddp_model, name, ddp_model.__dict__.get(name, MISSING)))
        ddp_model.__dict__[name] = refuse
    return handles


def process_backend(group: dist.ProcessGroup, device: torch.device) -> str:
    """The backend that reduces ``device`` tensors on ``group``. A group created without a
    backend (``init_process_group()``) reports "undefined" but holds one backend per device
    type; the one for the gradients' device is what the dtype and NCCL checks must judge."""
    name = dist.get_backend(group)
    if name in ("gloo", "nccl"):
        return name
    try:
        return group._get_backend(device).name()
    except Exception:
        if name == "undefined":
            raise BadInput(f"the DDP model's process group has no backend for {device.type} "
                           "tensors (init_process_group() without a backend?): pass "
                           "backend='gloo' or 'nccl'") from None
        return name  # a third-party backend: the dtype checks cannot judge it


def validate_target(ddp_model: object, cfg: SyncConfig) -> str:
    """Every reason ``harden`` must refuse, checked before anything is registered and before
    any collective; returns the backend that will reduce the gradients."""
    if not isinstance(ddp_model, DDP):
        raise BadInput(f"harden() needs a torch DistributedDataParallel model or an FSDP2 "
                       f"(fully_shard) module; got {type(ddp_model).__name__}")
    refuse_python_reducer(ddp_model)
    if getattr(ddp_model, HARDENED_MARK, None) is not None:
        raise BadInput("this DDP model is already hardened (harden() called twice?): close() "
                       "the first state before hardening it again")
    hook = registered_hook(ddp_model)
    if hook is not None:
        raise BadInput(f"this DDP model already has a comm hook ({hook}; harden() called twice, "
                       "or another hook registered): DDP accepts one")
    params = [p for p in ddp_model.module.parameters() if p.requires_grad]
    device = params[0].device if params else torch.device("cpu")
    backend = process_backend(ddp_model.process_group, device)
    allowed = reducible_dtypes(backend, nccl_version() if backend == "nccl" else None)
    if allowed is None:
        return backend
    grad_dtypes = {p.dtype for p in params}
    wire = grad_dtypes if cfg.wire is Wire.NATIVE else {WIRE_DTYPES[cfg.wire]}
    bad = sorted(str(d) for d in wire - allowed)
    if bad:
        raise BadInput(f"backend {backend} cannot reduce wire dtype(s) {', '.join(bad)}; choose "
                       f"--wire among {sorted(str(d) for d in allowed)}")
    return backend


def refuse_python_reducer(ddp_model: DDP) -> None:
    """Compiled autograd drives DDP only through its Python reducer (torch refuses it with the
    C++ one), chosen when the DDP model is built under ``torch._dynamo.config.optimize_ddp =
    "python_reducer"``. Then DDP's C++ reducer is off and it calls a comm hook once per
    parameter, dropping its return value: the accumulator hooks, buckets and end-of-backward
    callback every guard stands on are gone, and the step guard's callback breaks compiled
    autograd's trace. ``BadInput`` naming it, rather than a guard that checks nothing."""
    if getattr(ddp_model, "_use_python_reducer", False):
        raise BadInput("this DDP model was built under torch._dynamo.config.optimize_ddp="
                       "'python_reducer', the mode compiled autograd needs: DDP then reduces "
                       "in Python without its C++ reducer, which harden() guards. Compiled "
                       "autograd is not supported: build DDP under the default optimize_ddp "
                       "('ddp_optimizer'; torch.compile the model before wrapping it) and run "
                       "backward without compiled autograd")


def validate_fsdp_target(model: FSDPModule, cfg: SyncConfig) -> None:
    """What ``harden()`` refuses on an FSDP2 module, before anything is registered: a second
    hardening, a guard or wire other than the step guard's native one (FSDP2's own
    ``MixedPrecisionPolicy`` chooses its wire), no sharded parameter, a mesh whose replicas
    cannot be read from the placements (``fsdp/mesh.py``: a ``Partial`` parameter, meshes not
    sliced from one)."""
    from torch.distributed.tensor import DTensor  # here: a DDP user's torch may lack it

    if getattr(model, HARDENED_MARK, None) is not None:
        raise BadInput("this FSDP2 module is already hardened (harden() called twice?): close() "
                       "the first guard before hardening it again")
    if cfg.guard is not Guard.STEP or cfg.wire is not Wire.NATIVE:
        raise BadInput("an FSDP2 module takes the step guard with the native wire only "
                       "(FSDP2's MixedPrecisionPolicy sets its reduce dtype); got guard "
                       f"{cfg.guard.value}, wire {cfg.wire.value}")
    tracked = [(n, p) for n, p in model.named_parameters()
               if p.requires_grad and isinstance(p, DTensor)]
    if not tracked:
        raise BadInput("this FSDP2 module has no sharded (DTensor) parameter to guard: harden "
                       "the root module that fully_shard was applied to last")
    from openclaw_ref.sync.fsdp.mesh import seats

    seats(model, tracked)  # BadInput where the mesh cannot be read (fsdp/mesh.py)
