"""Were the tensor-parallel ranks of one data-parallel group fed the same batch? Under a TP plan
whose first module takes its input replicated over tp (``ColwiseParallel()``'s and
``RowwiseParallel``'s embedding default, ``input_layouts=Replicate()``), every tp rank must see
the same batch: TP's input hook wraps each rank's local tensor as the replicated value without
checking it, so a data loader that shards by global rank instead of by dp rank trains on a
different batch per tp rank — silently, the replicated weights drifting apart.

What is compared: a digest of the tensors the user hands the root module's forward (every
forward since the last optimizer step, chained in order), over the ranks of the first TP
module's mesh (the tp group), in the step's one exchange. Why the root's input, not the TP
module's own: the root's forward hook runs eagerly even when the blocks are compiled, so the
check adds no graph break and changes no compiled graph.

Reading the plan, never guessing it: ``parallelize_module`` installs each style's input hook as
a closure over the style (``ParallelStyle``) and its mesh; the first module in registration order
with such a hook is read. Its first input's layout decides: ``Replicate`` — the check is on;
``Shard`` (sequence parallel fed the local part of the sequence), an unreadable hook or no TP
module at all — off, and ``summary()`` says why.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import style as style_module
from torch.distributed.tensor.parallel.style import ParallelStyle
from torch.distributed.tensor.placement_types import Placement
from torch.utils._pytree import tree_leaves

from openclaw_ref.sync.evidence.replica_digest import ReplicaDigest

_CHAIN = 0x9E3779B97F4A7C15  # the chain's multiplier (odd: a bijection mod 2^64)
_MASK = (1 << 64) - 1


def _closure(fn: object) -> list[object]:
    cells = getattr(fn, "__closure__", None) or ()
    out: list[object] = []
    for cell in cells:
        try:
            out.append(cell.cell_contents)
        except ValueError:  # an empty cell
            continue
    return out


def _style_class(fn: object) -> type | None:
    """The ``ParallelStyle`` subclass a TP input function belongs to: a bound method's
    instance, or, for the styles' static ``_prepare_input_fn``, the class its qualified name
    names in torch's ``style`` module."""
    bound = getattr(fn, "__self__", None)
    if isinstance(bound, ParallelStyle):
        return type(bound)
    owner, _, method = getattr(fn, "__qualname__", "").rpartition(".")
    cls = getattr(style_module, owner, None)
    if method == "_prepare_input_fn" and isinstance(cls, type) and issubclass(
            cls, ParallelStyle):
        return cls
    return None


def read_hook(hook: object) -> tuple[str, object, DeviceMesh] | None:
    """(style name, its first input's layout, its mesh) for a TP input hook, or None. The
    hook is ``distribute_module``'s closure over ``functools.partial(style._prepare_input_fn,
    input_layouts, …)`` and the mesh (``ColwiseParallel``, ``RowwiseParallel``,
    ``SequenceParallel``), or a closure over the style itself (``PrepareModuleInput``)."""
    name, layouts, mesh = None, None, None
    for value in _closure(hook):
        if isinstance(value, DeviceMesh):
            mesh = value
        elif isinstance(value, ParallelStyle):
            name, layouts = type(value).__name__, getattr(value, "input_layouts", None)
        elif isinstance(value, functools.partial) and _style_class(value.func) is not None:
            name = _style_class(value.func).__name__
            layouts = value.args[0] if value.args else None
    if name is None or mesh is None:
        return None
    if isinstance(layouts, (tuple, list)):
        layouts = layouts[0] if layouts else None
    return name, layouts, mesh


def read_plan(model: nn.Module) -> tuple[DeviceMesh | None, str]:
    """The tp mesh over which the root's input must be equal, or None and why not (module
    docstring)."""
    for name, module in model.named_modules():
        for hook in module._forward_pre_hooks.values():
            found = read_hook(hook)
            if found is None:
                continue
            style, layout, mesh = found
            if isinstance(layout, Placement) and layout.is_replicate():
                return mesh, ""
            return None, (f"off: the first tensor-parallel module ({name or 'the root'}, "
                          f"{style}) takes its input as {layout}, not replicated over tp")
    return None, "off: no tensor-parallel input hook was found"


class InputDigest:
    """The chained digest of the root's inputs since the last optimizer step, and the key of
    the ranks that must agree on it (1 + the tp mesh's lowest rank; 0: check off)."""

    def __init__(self, model: nn.Module, tensor_parallel: bool) -> None:
        mesh, self.off = read_plan(model) if tensor_parallel else (None, "off: no tp dim")
        self.key = 1 + int(mesh.mesh.min()) if mesh is not None else 0
        self.digest = ReplicaDigest()
        self.value = 0

    def forward(self, args: Iterable[object]) -> None:
        """Chain the digest of the tensors in ``args`` (a forward's inputs)."""
        if not self.key:
            return
        tensors = [t.to_local() if isinstance(t, DTensor) else t
                   for t in tree_leaves(list(args)) if isinstance(t, torch.Tensor)]
        flat = [t.detach().reshape(-1) for t in tensors]
        mine = ReplicaDigest.combine_on_host(self.digest.digests(flat).tolist()) if flat else 0
        self.value = ((self.value * _CHAIN + (mine & _MASK) + 1) & _MASK)

    def column(self) -> tuple[int, int]:
        """(key, digest) for the row, as int64 values."""
        return self.key, self.value - (1 << 64) if self.value >> 63 else self.value

    def reset(self) -> None:
        self.value = 0
