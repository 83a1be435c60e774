"""The compute canary's probe: one small forward and backward that every rank computes on the
same parameters, the same input, the same dropout seed and the same cotangent, touching nothing
of training (``canary`` schedules it and compares its digests).

The input. A slice of one rank's real micro-batch (``capture``: the first ``PROBE_ROWS`` rows
of every tensor whose first dimension is the batch's, any other tensor whole; ints, floats,
bools and None as they are), sent to every rank as tensors (``share``: a fixed-size int64
header, then the bytes; never a pickle), and rebuilt into the tree of the receiving rank's own
arguments (``rebuild``). A leaf the header cannot describe (a string, an object) stays the
receiving rank's own.

What is not touched (``run_probe``): the module is called through ``type(module).forward``, or
through the forward its instance carried at hardening (a client's persistent wrapper, such as
Accelerate's mixed-precision autocast) — not ``__call__``: no hook of the root module runs —
with its parameters and buffers swapped for stand-ins for the call
(``torch.nn.utils.stateless._reparametrize_module``, tied weights kept tied): each parameter a
new leaf sharing its storage (``detach``), each buffer a clone
(BatchNorm's running statistics go to the clone). So no ``.grad`` of the user's parameters, no
buffer and no gradient accumulator DDP hooked is touched. The backward runs inside the swap too:
a checkpointed segment recomputes its forward in the backward, and would otherwise reach the
user's parameters. The RNG streams are forked and seeded with the probe's own seed
(``torch.random.fork_rng``), so the user's streams continue as if nothing ran; the backward
starts from a cotangent drawn from a fixed CPU generator.
Submodules' hooks do run (they are part of the computation the probe checks).
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.utils.stateless import _reparametrize_module
from torch.utils._pytree import tree_flatten, tree_unflatten

PROBE_ROWS = 2  # rows of the owner's batch (2: BatchNorm in training mode needs > 1 value)
HEADER = 256  # int64 words of the input's description
MAX_DIMS = 8
COTANGENT_SEED = 0x5EED
_DTYPES: tuple[torch.dtype, ...] = (
    torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32,
    torch.int16, torch.int8, torch.uint8, torch.bool, torch.complex64, torch.complex128)
TENSOR, INT, FLOAT, BOOL, NONE, OTHER = range(1, 7)
_GRAD_BIT = 8  # a tensor's dtype code carries its requires_grad flag above this bit


@dataclass
class ProbeInput:
    """A rank's view of the probe's input: the tree of its own call (``spec``) and one value
    per leaf (the owner's slice once shared; the rank's own value where it cannot be sent)."""

    spec: Any
    leaves: list[Any]


def capture(args: tuple, kwargs: dict) -> ProbeInput:
    """The slice of this call's input the probe would use: ``PROBE_ROWS`` rows of each
    batch-major tensor (cloned, so a caller that reuses its buffers changes nothing here)."""
    leaves, spec = tree_flatten((args, kwargs))
    tensors = [t for t in leaves if isinstance(t, torch.Tensor) and t.dim() > 0]
    batch = tensors[0].shape[0] if tensors else None
    out = []
    for leaf in leaves:
        if isinstance(leaf, torch.Tensor):
            rows = leaf.dim() > 0 and leaf.shape[0] == batch
            leaf = (leaf[:PROBE_ROWS] if rows else leaf).detach().clone().requires_grad_(
                leaf.requires_grad)
        out.append(leaf)
    return ProbeInput(spec, out)


def _describe(leaves: Sequence[Any]) -> tuple[list[int], list[torch.Tensor]] | None:
    """The header words and the tensors to send of an input; None when it does not fit."""
    words, tensors = [len(leaves)], []
    for leaf in leaves:
        if isinstance(leaf, torch.Tensor):
            if leaf.dtype not in _DTYPES or leaf.dim() > MAX_DIMS or leaf.is_sparse:
                return None
            words += [TENSOR, _DTYPES.index(leaf.dtype) | leaf.requires_grad << _GRAD_BIT,
                      leaf.dim(), *leaf.shape]
            tensors.append(leaf)
        elif isinstance(leaf, bool):
            words += [BOOL, int(leaf)]
        elif isinstance(leaf, int) and -(1 << 63) <= leaf < 1 << 63:
            words += [INT, leaf]
        elif isinstance(leaf, float):
            words += [FLOAT, struct.unpack("<q", struct.pack("<d", leaf))[0]]
        elif leaf is None:
            words += [NONE]
        else:
            words += [OTHER]
    return (words, tensors) if len(words) <= HEADER else None


def share(mine: ProbeInput | None, owner: int, group, device: torch.device
          ) -> list[Any] | None:
    """The owner's leaves on every rank: its header broadcast (a fixed ``HEADER`` words, so
    every rank sends the same size whatever it holds), then its tensors' bytes (a size every
    rank read from that header). None on every rank when the owner has no input to share.
    ``mine``: the owner's capture (ignored elsewhere); ``owner``: a rank of ``group``."""
    is_owner = dist.get_rank(group) == owner
    described = _describe(mine.leaves) if is_owner and mine is not None else None
    header = torch.zeros(HEADER + 1, dtype=torch.int64)
    if described is not None:
        words, tensors = described
        nbytes = sum(t.numel() * t.element_size() for t in tensors)
        header[:len(words) + 1] = torch.tensor([nbytes, *words])
    header = header.to(device)
    src = dist.get_global_rank(group, owner)
    dist.broadcast(header, src, group=group)
    head = header.tolist()
    if head[1] == 0:
        return None
    payload = torch.empty(head[0], dtype=torch.uint8, device=device)
    if is_owner and head[0]:
        payload.copy_(torch.cat([t.contiguous().reshape(-1).view(torch.uint8).to(device)
                                 for t in tensors]))
    if head[0]:
        dist.broadcast(payload, src, group=group)
    return _decode(head[1:], payload)


def _decode(words: list[int], payload: torch.Tensor) -> list[Any]:
    """The leaves a header and payload describe (``OTHER``: a placeholder, kept local)."""
    leaves, at, offset = [], 0, 0
    for _ in range(words[0] if words else 0):
        at += 1
        kind = words[at]
        if kind == TENSOR:
            code, ndim = words[at + 1], words[at + 2]
            dtype = _DTYPES[code & ((1 << _GRAD_BIT) - 1)]
            shape = words[at + 3:at + 3 + ndim]
            at += 2 + ndim
            n = dtype.itemsize
            for d in shape:
                n *= d
            leaf = payload[offset:offset + n].view(dtype).reshape(shape).clone()
            leaves.append(leaf.requires_grad_(bool(code >> _GRAD_BIT)))
            offset += n
        elif kind in (INT, BOOL, FLOAT):
            at += 1
            v = words[at]
            leaves.append(bool(v) if kind == BOOL else v if kind == INT
                          else struct.unpack("<d", struct.pack("<q", v))[0])
        elif kind == NONE:
            leaves.append(None)
        else:
            leaves.append(_OTHER)
    return leaves


_OTHER = object()


def rebuild(local: ProbeInput | None, shared: list[Any], device: torch.device
            ) -> tuple[tuple, dict] | None:
    """The probe's ``(args, kwargs)`` on this rank: the shared leaves in its own call's tree
    (a leaf sent as ``OTHER`` keeps this rank's value); None when the trees do not match."""
    if local is None or len(local.leaves) != len(shared):
        return None
    leaves = []
    for mine, theirs in zip(local.leaves, shared):
        if theirs is _OTHER:
            leaves.append(mine)
        elif isinstance(theirs, torch.Tensor):
            where = mine.device if isinstance(mine, torch.Tensor) else device
            leaves.append(theirs.detach().to(where).requires_grad_(theirs.requires_grad))
        else:
            leaves.append(theirs)
    return tree_unflatten(leaves, local.spec)


def cotangent_like(t: torch.Tensor, seed: int) -> torch.Tensor:
    """The backward's seed for output ``t``: normal values from a CPU generator seeded with
    ``seed`` — the same on every rank and every device."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(t.shape, generator=g, dtype=torch.float32).to(t.device, t.dtype)


def run_probe(module: nn.Module, tracked: Sequence[tuple[str, nn.Parameter]], args: tuple,
              kwargs: dict, seed: int, forward: Callable[..., Any] | None = None, *,
              value: Callable[[torch.Tensor], torch.Tensor] = torch.Tensor.detach,
              around: Callable[[], AbstractContextManager] = nullcontext
              ) -> list[torch.Tensor | None]:
    """Each tracked parameter's gradient of the probe (None where it got none), computed as
    the module docstring says: nothing of training is read back or written. ``forward``: the
    instance's own forward to call instead of the class's (a client's persistent wrapper);
    ``value``: a parameter's stand-in values (its storage, detached; FSDP2: its full tensor);
    ``around``: what the forward and backward run inside (FSDP2: its own hooks hidden)."""
    stand_ins: dict[str, torch.Tensor] = {}
    by_id: dict[int, torch.Tensor] = {}
    with torch.no_grad():
        for name, p in module.named_parameters(remove_duplicate=False):
            if id(p) not in by_id:
                by_id[id(p)] = value(p).requires_grad_(p.requires_grad)
            stand_ins[name] = by_id[id(p)]
    for name, b in module.named_buffers(remove_duplicate=False):
        stand_ins[name] = b.clone()
    devices = sorted({p.device.index or 0 for _, p in tracked if p.is_cuda})
    with torch.random.fork_rng(devices=devices, device_type="cuda"), torch.enable_grad():
        torch.default_generator.manual_seed(seed)
        for d in devices:
            torch.cuda.default_generators[d].manual_seed(seed)
        # the backward too runs with the stand-ins in place: a checkpointed segment
        # recomputes its forward there, and must not reach the user's parameters
        with around(), _reparametrize_module(module, stand_ins, tie_weights=True):
            out = (forward(*args, **kwargs) if forward is not None
                   else type(module).forward(module, *args, **kwargs))
            outs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)
                    and t.requires_grad and (t.is_floating_point() or t.is_complex())]
            if outs:
                torch.autograd.backward(outs, [cotangent_like(t, seed + i)
                                               for i, t in enumerate(outs)])
    grads = []
    for name, p in tracked:
        leaf = by_id.get(id(p), stand_ins.get(name))
        g = leaf.grad if leaf is not None else None
        grads.append(g.to_dense() if g is not None and g.is_sparse else g)
    return grads
