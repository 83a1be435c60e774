"""Per-rank measurements taken inside a step, without adding any collective to it.

Everything here is rank-local; the training loop gathers it once, at the end of a run.
"""

from __future__ import annotations

import ctypes
import gc
import resource
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from openclaw_ref.arms.config import ArmConfig
from openclaw_ref.core.callbacks import Callback

# The seed's C2 names `layer.3.attn.v_proj.weight`; we watch every layer's v_proj and ffn.w1.
DEFAULT_NORM_SUFFIXES = ("attn.v_proj.weight", "ffn.w1.weight")


class GradientProbe(Callback):
    """Which parameters received a gradient on this rank this step, and the local L2 norm of the
    watched ones, read *before* synchronization (a post-accumulate hook fires before DDP's
    reducer writes the averaged gradient back). A loop callback: its hooks are registered at
    ``setup`` (after any fault reordered the model) and its figures cleared before each forward."""

    def __init__(self, norm_suffixes: Sequence[str] = DEFAULT_NORM_SUFFIXES) -> None:
        self.norm_suffixes = tuple(norm_suffixes)
        self.names: list[str] = []
        self.watched: list[str] = []
        self._present: set[str] = set()
        self._norms: dict[str, torch.Tensor] = {}
        self._handles: list = []

    def setup(self, model: nn.Module, sync: ArmConfig) -> ArmConfig:
        self.names = [n for n, p in model.named_parameters() if p.requires_grad]
        self.watched = [n for n in self.names if n.endswith(self.norm_suffixes)]
        for name, p in model.named_parameters():
            if p.requires_grad:
                self._handles.append(p.register_post_accumulate_grad_hook(self._hook(name)))
        return sync

    def _hook(self, name: str):
        watched = name in set(self.watched)

        def hook(p: torch.Tensor) -> None:
            self._present.add(name)
            if watched and p.grad is not None:
                self._norms[name] = p.grad.detach().norm()
        return hook

    def before_forward(self, step: int, model: nn.Module) -> None:
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

    def close(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()


_CLEAR_REFS = "/proc/self/clear_refs"
_STATUS = "/proc/self/status"


def _vm_hwm_kib() -> int | None:
    """VmHWM (the resident-set high-water mark, KiB) from /proc/self/status; None elsewhere."""
    try:
        with open(_STATUS, encoding="ascii") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def reset_peak_memory(device: torch.device) -> str:
    """Start a run's peak-memory window; returns its scope, ``"run"`` or ``"process"``.

    Why: a worker pool runs many measured runs in one process, and ``ru_maxrss`` is the
    process's lifetime maximum, so every run after the biggest one would inherit its peak.
    CUDA: the allocator's peak is reset. Linux: freed heap is handed back first (``gc`` and
    glibc's ``malloc_trim``), then writing "5" to /proc/self/clear_refs resets VmHWM to the
    current RSS — so a run's figure still includes what the process holds at its start
    (torch's code and caches, ~330 MiB for the tiny preset here), never an earlier run's
    peak. Elsewhere (or if /proc refuses) the figure stays the process's lifetime peak and
    the scope says so; a fresh process per run is then the only per-run figure. Pass the
    returned scope to ``peak_memory_mb``: it names what that figure measures."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return "run"
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: the reset below still bounds the figure
        pass
    try:
        with open(_CLEAR_REFS, "w", encoding="ascii") as f:
            f.write("5")
    except OSError:
        return "process"
    return "run" if _vm_hwm_kib() is not None else "process"


def peak_memory_mb(device: torch.device, scope: str = "process") -> float:
    """Peak memory of this rank: CUDA's allocator peak on GPU; on CPU the resident high-water
    mark (VmHWM) since the ``reset_peak_memory`` that returned ``scope == "run"``, else the
    process's max RSS."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    if scope == "run":
        hwm = _vm_hwm_kib()
        if hwm is not None:
            return hwm / 1024.0
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
    if len(values) == 0:
        raise ValueError("percentile of no values")
    return float(np.percentile(np.asarray(values, dtype=np.float64), q))


@dataclass(frozen=True)
class RatioInterval:
    """A ratio with its bootstrap percentile interval over ``n`` paired samples."""

    point: float
    low: float
    high: float
    n: int

    def contains(self, x: float) -> bool:
        return self.low <= x <= self.high


def _pairs(num: Sequence[float], den: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    if len(num) != len(den) or not num:
        raise ValueError(f"need equal, non-empty paired samples; got {len(num)} and {len(den)}")
    if min(den) <= 0:
        raise ValueError("the denominator samples must be positive")
    return np.asarray(num, dtype=np.float64), np.asarray(den, dtype=np.float64)


def _resample_indices(n: int, resamples: int, seed: int) -> np.ndarray:
    """``resamples`` × ``n`` pair indices drawn with replacement by a seeded generator."""
    return np.random.default_rng(seed).integers(0, n, size=(resamples, n))


def _interval(values: np.ndarray, confidence: float) -> tuple[float, float]:
    tail = 100 * (1 - confidence) / 2
    low, high = np.percentile(values, [tail, 100 - tail])
    return float(low), float(high)


def bootstrap_ratio(num: Sequence[float], den: Sequence[float], *, resamples: int = 2000,
                    confidence: float = 0.95, seed: int = 0) -> RatioInterval:
    """median(num) / median(den) with a paired percentile-bootstrap interval.

    Why paired: ``num[i]`` and ``den[i]`` come from the same interleaved repeat, so they share
    the host's drift; resampling repeat indices keeps that pairing. Invariants: the generator
    is seeded, so the same inputs always give the same interval (a re-render never flips a
    verdict); ``low <= high``; the interval collapses to the point when every pair agrees."""
    num_a, den_a = _pairs(num, den)
    idx = _resample_indices(len(num_a), resamples, seed)
    low, high = _interval(np.median(num_a[idx], axis=1) / np.median(den_a[idx], axis=1),
                          confidence)
    return RatioInterval(float(np.median(num_a) / np.median(den_a)), low, high, len(num_a))


def median_paired_ratio(num: Sequence[float], den: Sequence[float], *, resamples: int = 2000,
                        confidence: float = 0.95, seed: int = 0) -> RatioInterval:
    """The median of the per-pair ratios ``num[i] / den[i]``, with a seeded bootstrap interval.

    For step times of arms interleaved step by step: each ratio divides two steps that ran
    milliseconds apart, so a load spike from another process moves both and cancels, where a
    ratio of medians lets a spike that hit one arm's steps more than the other's through. Same
    invariants as ``bootstrap_ratio``."""
    num_a, den_a = _pairs(num, den)
    ratios = num_a / den_a
    idx = _resample_indices(len(ratios), resamples, seed)
    low, high = _interval(np.median(ratios[idx], axis=1), confidence)
    return RatioInterval(float(np.median(ratios)), low, high, len(ratios))
