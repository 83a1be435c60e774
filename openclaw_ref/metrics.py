"""Per-rank measurements taken inside a step, without adding any collective to it.

Everything here is rank-local; the training loop gathers it once, at the end of a run.
"""

from __future__ import annotations

import math
import resource
import time
from typing import Sequence

import torch
from torch import nn

# The seed's C2 names `layer.3.attn.v_proj.weight`; we watch every layer's v_proj and ffn.w1.
DEFAULT_NORM_SUFFIXES = ("attn.v_proj.weight", "ffn.w1.weight")


class GradientProbe:
    """Which parameters received a gradient on this rank this step, and the local L2 norm of the
    watched ones, read *before* synchronization (a post-accumulate hook fires before DDP's
    reducer writes the averaged gradient back)."""

    def __init__(self, model: nn.Module, norm_suffixes: Sequence[str] = DEFAULT_NORM_SUFFIXES):
        self.names = [n for n, p in model.named_parameters() if p.requires_grad]
        self.watched = [n for n in self.names if n.endswith(tuple(norm_suffixes))]
        self._present: set[str] = set()
        self._norms: dict[str, torch.Tensor] = {}
        self._handles = []
        for name, p in model.named_parameters():
            if p.requires_grad:
                self._handles.append(p.register_post_accumulate_grad_hook(self._hook(name)))

    def _hook(self, name: str):
        watched = name in set(self.watched)

        def hook(p: torch.Tensor) -> None:
            self._present.add(name)
            if watched and p.grad is not None:
                self._norms[name] = p.grad.detach().norm()
        return hook

    def begin_step(self) -> None:
        self._present.clear()
        self._norms.clear()

    def missing(self) -> list[str]:
        """Parameters with no local gradient this step (e.g. experts no sample was routed to)."""
        return [n for n in self.names if n not in self._present]

    def norms(self) -> dict[str, float | None]:
        """Local gradient norms of the watched parameters; None where the rank had none."""
        if not self._norms:
            return {n: None for n in self.watched}
        values = torch.stack(list(self._norms.values())).tolist()  # one host sync per step
        got = dict(zip(self._norms, values))
        return {n: got.get(n) for n in self.watched}

    def remove(self) -> None:
        for h in self._handles:
            h.remove()


def peak_memory_mb(device: torch.device) -> float:
    """Peak memory of this rank: CUDA's allocator peak on GPU, the process's max RSS on CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux


class StepTimer:
    """Wall time of a step; on CUDA it waits for the device so the figure is the real one."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._t0 = 0.0

    def start(self) -> None:
        self._sync()
        self._t0 = time.perf_counter()

    def stop_ms(self) -> float:
        self._sync()
        return (time.perf_counter() - self._t0) * 1e3

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolation percentile (numpy's default), q in [0, 100]."""
    if not values:
        raise ValueError("percentile of no values")
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)
