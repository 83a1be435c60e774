"""What every section of ``openclaw-bench compare`` is handed: the comparison's configuration
(``CompareConfig``, its quick form ``quick_config``, the directory it writes) and the progress
counter its jobs tick.

Why a module of its own: the sections (``sections/``), the registry, the checkpoints and the
partial-run merge all read these, and the driver (``compare.py``) reads all of them; here below
them, none of them imports the driver back (``tests/test_layers.py``).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from openclaw_ref.core.jsonio import check_output_dir
from openclaw_ref.core.launch import on_cuda, resolve_backend
from openclaw_ref.core.model import PRESETS
from openclaw_ref.core.progress import progress_bar
from openclaw_ref.experiments.sections import NAMES as SECTIONS
from openclaw_ref.sync.errors import BadInput

PUBLISHED_ROOT = "results"  # where ``compare`` writes the published comparison


def default_world_sizes() -> tuple[int, ...]:
    """1, 2, 4 on CPU; on a GPU box every power of two up to the GPU count."""
    if torch.cuda.is_available() and torch.cuda.device_count() > 1:
        n = torch.cuda.device_count()
        return tuple(w for w in (1, 2, 4, 8, 16, 32, 64) if w <= n)
    return (1, 2, 4)


@dataclass(frozen=True)
class CompareConfig:
    world_sizes: tuple[int, ...] = field(default_factory=default_world_sizes)
    preset: str = "tiny"
    steps: int = 40
    repeats: int = 5  # timing verdicts need >= 5 interleaved repeats (claims.MIN_REPEATS)
    # The P2 barrier's off/on pairs, a new jitter draw each (p2bench.jitter_seed): 5 pairs on
    # one draw gave intervals that did not overlap between two regenerations of the same code.
    p2_repeats: int = 15
    global_batch: int = 32
    bucket_cap_mb: float = 0.025  # the tiny model is 0.15 MB: this cap gives it ~6 buckets
    curve_steps: int = 300
    curve_world_size: int = 2
    seed: int = 1
    backend: str = "auto"
    # FP16 overflow (F3) and the rank-dependent pre-scale (M4) also run at these sizes: the
    # seed's claims are about an 8-rank FP16 sum (a count, not a timing: 8 gloo ranks on 2
    # cores are fine). () = only the comparison's own sizes.
    overflow_extra_sizes: tuple[int, ...] = (8,)
    overflow_steps: int = 8
    mismatch_steps: int = 8
    lightning_steps: int = 12
    lightning_devices: int = 2
    hook_steps: int = 150  # timed steps per arm of each interleaved hook-cost job
    sections: tuple[str, ...] = tuple(SECTIONS)
    out_root: str = PUBLISHED_ROOT
    tag: str | None = None
    quick: bool = False  # a representative subset of every section (``quick_config``)

    def validate(self) -> None:
        if not self.world_sizes or min(self.world_sizes) < 1:
            raise BadInput("world sizes must be >= 1")
        for w in self.world_sizes:
            if self.global_batch % w:
                raise BadInput(f"global batch {self.global_batch} not divisible by world size {w}")
        if self.preset not in PRESETS:
            raise BadInput(f"unknown preset {self.preset!r}; choose one of {', '.join(PRESETS)}")
        if self.steps < 5 or min(self.repeats, self.p2_repeats, self.curve_steps) < 1:
            raise BadInput("need steps >= 5, repeats >= 1, P2 repeats >= 1 and curve steps >= 1")
        if any(w < 2 for w in self.overflow_extra_sizes):
            raise BadInput("extra overflow world sizes must be >= 2")
        if self.hook_steps < 5:
            raise BadInput("need hook steps >= 5")
        if self.lightning_devices < 1 or self.lightning_steps < 3:
            raise BadInput("need lightning devices >= 1 and lightning steps >= 3")
        unknown = set(self.sections) - set(SECTIONS)
        if unknown:
            raise BadInput(f"unknown sections {sorted(unknown)}; known: {', '.join(SECTIONS)}")
        resolve_backend(self.backend, max(self.world_sizes))
        if self.quick and under_published_root(self.out_dir()):
            raise BadInput(f"--quick never writes under {PUBLISHED_ROOT}/ (the published "
                           f"comparison); got {self.out_dir()}: give --out-root a scratch "
                           "directory, or none for a new temporary one")
        check_output_dir(self.out_dir(), "--out-root/--tag")

    def out_dir(self) -> Path:
        return Path(self.out_root) / (self.tag or machine_tag(self.backend, max(self.world_sizes)))


# ``compare --quick``: the smallest settings that still fill every table and plot (2 repeats
# give the paired ratio columns an interval; 1 and 2 ranks stay within 2 cores)
QUICK_SETTINGS: dict[str, Any] = {
    "world_sizes": (1, 2), "steps": 8, "repeats": 2, "p2_repeats": 2, "curve_steps": 20,
    "overflow_extra_sizes": (), "overflow_steps": 3, "mismatch_steps": 3, "lightning_steps": 3,
    "hook_steps": 10,
}


def quick_config(**overrides: Any) -> CompareConfig:
    """The quick comparison: ``QUICK_SETTINGS`` and each section's quick subset; ``overrides``
    (e.g. ``out_root``, ``sections``) replace any field but ``quick``."""
    return CompareConfig(**{**QUICK_SETTINGS, **overrides, "quick": True})


def published_roots() -> list[Path]:
    """The directories a quick run must stay out of: ``results/`` under the working directory
    and the checkout's own ``results/`` (where this package runs from a checkout)."""
    checkout = Path(__file__).resolve().parents[2] / PUBLISHED_ROOT
    return [Path(PUBLISHED_ROOT).resolve(), checkout]


def under_published_root(path: Path) -> bool:
    resolved = path.resolve()
    return any(resolved == root or resolved.is_relative_to(root) for root in published_roots())


def machine_tag(backend: str, world_size: int) -> str:
    """Names the machine class a result belongs to, e.g. ``cpu2-gloo`` or ``8xH100-nccl`` (also
    ``1xH200-nccl`` when ``--backend nccl`` runs its larger world sizes as gloo on one GPU)."""
    resolved = resolve_backend(backend, world_size)
    if on_cuda(backend, world_size):
        name = torch.cuda.get_device_name(0).replace("NVIDIA ", "").split()[0]
        return f"{torch.cuda.device_count()}x{name}-nccl"
    return f"cpu{os.cpu_count()}-{resolved}"



@dataclass
class Progress:
    """Counts jobs across sections; a tqdm bar when it is a terminal, lines otherwise."""

    total: int
    done: int = 0
    _bar: Any = None

    def __post_init__(self) -> None:
        self._bar = progress_bar(total=self.total, unit="job", desc="compare", mininterval=1.0)

    def section(self, name: str) -> None:
        """One line per section start: a log that survives a non-terminal stderr."""
        self._bar.write(f"compare: section {name} started", file=sys.stderr)

    def tick(self, what: str) -> None:
        self.done += 1
        self._bar.set_postfix_str(what[:60])
        self._bar.update(1)

    def close(self) -> None:
        self._bar.close()
