"""The compute canary's probe: one small forward and backward that every rank computes on the
same parameters, the same input (``canary.input``), the same dropout seed and the same
cotangent, touching nothing of training (``canary`` schedules it and compares its results).

What it yields (``ProbeResult``): per tracked parameter, the 64-bit digest of its probe
gradient (``ReplicaDigest``: any change confined to one word is seen with certainty) and two
float64 figures, the gradient's sum and its mass (sum of magnitudes) — the figures measure how
FAR two results are, which a digest cannot (``canary.tolerance``).

Bounded memory. Each gradient is taken from its stand-in the moment autograd accumulates it (a
post-accumulate-grad hook), queued, and digested with the others queued once they reach
``BLOCK_BYTES``; then dropped. So the probe never holds more than one block of gradients — at
most ``BLOCK_BYTES`` of small ones, or one parameter's — however large the model, and
``ProbeResult.held_bytes`` says how much it held at its peak. The forward's activations are
those of ``PROBE_ROWS`` rows. Parameters are stand-ins sharing the user's storage (no copy)
under DDP; FSDP2's full tensors are its own module's matter (``fsdp.canary``).

What is not touched: the module is called through ``type(module).forward``, or through the
forward its instance carried at hardening (a client's persistent wrapper, such as Accelerate's
mixed-precision autocast) — not ``__call__``: no hook of the root module runs — with its
parameters and buffers swapped for stand-ins for the call
(``torch.nn.utils.stateless._reparametrize_module``, tied weights kept tied): each parameter a
new leaf sharing its storage (``detach``), each buffer a clone (BatchNorm's running statistics
go to the clone). So no ``.grad`` of the user's parameters, no buffer and no gradient
accumulator DDP hooked is touched. The backward runs inside the swap too: a checkpointed segment
recomputes its forward in the backward, and would otherwise reach the user's parameters. The RNG
streams — torch's, and Python's and numpy's global ones — are forked and seeded with the
probe's own seed (``torch.random.fork_rng``, ``host_rngs``), so the user's streams continue as
if nothing ran; the backward starts from a cotangent drawn from a
fixed CPU generator. Submodules' hooks do run (they are part of the computation the probe
checks).

Compiled models. A ``torch.compile``d module is probed through the module it wraps, and the whole
probe runs under ``torch.compiler.set_stance("force_eager")``: dynamo never sees the probe's
2-row input, so the compiled training step keeps its graphs — no recompile, no graph break —
and the probe checks the eager kernels of the same hardware.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import nn
from torch.nn.modules.module import register_module_forward_pre_hook
from torch.nn.utils.stateless import _reparametrize_module
from torch.utils._pytree import tree_flatten

from openclaw_ref.sync.canary.stream import GradStream
from openclaw_ref.sync.evidence.replica_digest import ReplicaDigest

COTANGENT_SEED = 0x5EED
BLOCK_BYTES = 1 << 20  # gradients queued before they are digested and dropped


@dataclass
class ProbeResult:
    """One probe run: a digest per tracked parameter (0 where it got no gradient), its
    figures — ``(2·P,)`` float64, each parameter's gradient sum then mass — the most gradient
    bytes the probe held at once, and whether any of it computed in a 16-bit float (autocast,
    or 16-bit parameters): what sets the tolerance its noise needs."""

    digests: list[int] | torch.Tensor
    figures: torch.Tensor
    held_bytes: int = 0
    low_precision: bool = False  # some of it ran in bf16/fp16 (``canary.tolerance``)
    param_bytes: int = 0  # FSDP2: the most bytes of gathered parameters alive at once

    def digest_list(self) -> list[int]:
        return self.digests if isinstance(self.digests, list) else self.digests.tolist()


class LazyParameters(Protocol):
    """Parameters a probe gathers only where they are used (``run_probe``'s ``lazy``): their
    ids, the context that gives the module their values while the probe runs (gradients put
    into ``stream`` at the tracked indices ``where``), and the most bytes it held at once."""

    ids: frozenset[int]
    peak_bytes: int

    def installed(self, stream: GradStream, where: dict[int, list[int]]
                  ) -> AbstractContextManager: ...


def cotangent_like(t: torch.Tensor, seed: int) -> torch.Tensor:
    """The backward's seed for output ``t``: normal values from a CPU generator seeded with
    ``seed`` — the same on every rank and every device."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(t.shape, generator=g, dtype=torch.float32).to(t.device, t.dtype)


def eager() -> AbstractContextManager:
    """Compiled code runs eagerly inside (``torch.compiler.set_stance("force_eager")``; where a
    torch has no stances, dynamo is disabled for the block)."""
    stance = getattr(torch.compiler, "set_stance", None)
    if stance is not None:
        return stance("force_eager")
    return torch._dynamo.config.patch(disable=True)


class _Precision:
    """Whether a 16-bit float computes anywhere in the probe: autocast on the parameters'
    device where the probe is called or where any submodule is called (a forward wrapper such
    as Accelerate's enters it inside the call), or 16-bit parameters. A global forward
    pre-hook, registered for the probe's forward only."""

    def __init__(self, device: torch.device, tracked: Sequence[tuple[str, nn.Parameter]]):
        self.device = device.type
        self.low = any(p.dtype in _LOW for _, p in tracked) or self.autocast()

    def autocast(self) -> bool:
        try:
            return torch.is_autocast_enabled(self.device)
        except TypeError:  # torch < 2.4: no device argument
            return (torch.is_autocast_cpu_enabled() if self.device == "cpu"
                    else torch.is_autocast_enabled())

    def __call__(self, module: nn.Module, args: tuple) -> None:
        self.low = self.low or self.autocast()


_LOW = (torch.float16, torch.bfloat16)


@contextmanager
def host_rngs(seed: int) -> Iterator[None]:
    """Python's and numpy's global random streams seeded with ``seed`` for the block and put
    back after it: a forward that draws from them (a layer drop by ``random.random()``) draws
    the same on every rank, and the user's streams continue as if nothing ran."""
    try:
        import numpy as np  # torch's object collectives need it, but torch itself does not
    except ImportError:
        np = None
    state = random.getstate()
    np_state = np.random.get_state() if np is not None else None
    random.seed(seed)
    if np is not None:
        np.random.seed(seed & 0xFFFFFFFF)
    try:
        yield
    finally:
        random.setstate(state)
        if np is not None:
            np.random.set_state(np_state)


def unwrapped(module: nn.Module) -> nn.Module:
    """The module a ``torch.compile`` wrapper (``OptimizedModule``) compiles, else itself."""
    inner = getattr(module, "_orig_mod", None)
    return inner if isinstance(inner, nn.Module) else module


def run_probe(module: nn.Module, tracked: Sequence[tuple[str, nn.Parameter]], args: tuple,
              kwargs: dict, seed: int, forward: Callable[..., Any] | None = None, *,
              digest: ReplicaDigest | None = None,
              buffers: dict[str, torch.Tensor] | None = None,
              value: Callable[[torch.Tensor], torch.Tensor] = torch.Tensor.detach,
              around: Callable[[], AbstractContextManager] = nullcontext,
              lazy: LazyParameters | None = None,
              block_bytes: int = BLOCK_BYTES) -> ProbeResult:
    """The probe of the module docstring on ``(args, kwargs)`` with ``seed``: nothing of
    training is read back or written. ``forward``: the instance's own forward to call instead
    of the class's (a client's persistent wrapper); ``value``: a parameter's stand-in values
    (its storage, detached; FSDP2: its full tensor); ``around``: what the forward and backward
    run inside (FSDP2: its own hooks hidden); ``buffers``: the values the buffers' clones take
    (a re-run's: the buffers as they were at the first run), default the module's own;
    ``lazy``: parameters given their values only where they are used, a unit at a time
    (FSDP2: ``fsdp.canary_units``) — none of them is a stand-in here."""
    module = unwrapped(module)
    device = tracked[0][1].device if tracked else torch.device("cpu")
    stream = GradStream(len(tracked), digest or ReplicaDigest(), device, block_bytes)
    where = {id(p): [] for _, p in tracked}
    for i, (_, p) in enumerate(tracked):
        where[id(p)].append(i)
    stand_ins: dict[str, torch.Tensor] = {}
    by_id: dict[int, torch.Tensor] = {}
    skip = lazy.ids if lazy is not None else frozenset()
    with torch.no_grad():
        for name, p in module.named_parameters(remove_duplicate=False):
            if id(p) in skip:
                continue
            if id(p) not in by_id:
                by_id[id(p)] = leaf = value(p).requires_grad_(id(p) in where)
                if id(p) in where:
                    leaf.register_post_accumulate_grad_hook(stream.taker(where[id(p)]))
            stand_ins[name] = by_id[id(p)]
    for name, b in module.named_buffers(remove_duplicate=False):
        stand_ins[name] = (buffers[name] if buffers is not None and name in buffers
                           else b).clone()
    devices = sorted({p.device.index or 0 for _, p in tracked if p.is_cuda})
    with torch.random.fork_rng(devices=devices, device_type="cuda"), host_rngs(seed), \
            torch.enable_grad(), eager():
        torch.default_generator.manual_seed(seed)
        for d in devices:
            torch.cuda.default_generators[d].manual_seed(seed)
        # the backward too runs with the stand-ins in place: a checkpointed segment
        # recomputes its forward there, and must not reach the user's parameters
        precision = _Precision(device, tracked)
        watch = register_module_forward_pre_hook(precision)
        units = lazy.installed(stream, where) if lazy is not None else nullcontext()
        with around(), units, _reparametrize_module(module, stand_ins, tie_weights=True):
            try:
                out = (forward(*args, **kwargs) if forward is not None
                       else type(module).forward(module, *args, **kwargs))
            finally:
                watch.remove()
            outs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)
                    and t.requires_grad and (t.is_floating_point() or t.is_complex())]
            if outs:
                torch.autograd.backward(outs, [cotangent_like(t, seed + i)
                                               for i, t in enumerate(outs)])
    stream.flush()
    return ProbeResult(stream.digests, stream.figures, stream.held, precision.low,
                       lazy.peak_bytes if lazy is not None else 0)
