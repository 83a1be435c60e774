"""The sections every run configuration shares: what model is trained (``ModelSection``) and how
(``TrainSection``), with named presets of the latter, and what the run exports
(``MetricsConfig``: the Prometheus exporter and the P2 barrier of ``ops.prometheus``, which
builds them per rank; the loop takes that builder as its metrics sink, ``core/callbacks.py``).

Why sections: the training loop's ``TrainConfig``, the conformance settings and the Lightning
runner all train the same model the same way; each embeds these sections instead of repeating
preset, seed, steps, batch and learning rate, and ``TrainConfig.from_sections`` is the one
translation into a loop configuration.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass

from openclaw_ref.core.model import OpenClawConfig, preset
from openclaw_ref.sync.errors import BadInput


@dataclass(frozen=True)
class ModelSection:
    """Which model: an ``openclaw_ref.core.model`` preset, its seed and sparsity range."""

    preset: str = "tiny"
    seed: int = 1
    sparsity_range: tuple[float, float] | None = None  # None: the preset's (the seed's range)

    def model_config(self) -> OpenClawConfig:
        """The preset with this seed (and sparsity range); ``ValueError`` on a bad one."""
        overrides: dict = {"seed": self.seed}
        if self.sparsity_range is not None:
            overrides["sparsity_range"] = tuple(self.sparsity_range)
        return preset(self.preset, **overrides)


@dataclass(frozen=True)
class TrainSection:
    """How it is trained: steps, the global batch (all ranks together), the optimizer."""

    steps: int = 50
    global_batch: int = 32
    lr: float = 3e-3
    optimizer: str = "adamw"
    eval_every: int = 10  # 0 = only at the end
    amp: str | None = None  # autocast dtype of forward + loss: None (fp32), "bf16" or "fp16"


# Named presets of the training section.
TRAIN_PRESETS: dict[str, TrainSection] = {
    "run": TrainSection(),  # ``openclaw-bench train``'s defaults
    # small enough to run many times on two CPU cores; the batch divides by the world size
    "conformance": TrainSection(steps=6, global_batch=8, eval_every=0),
    "lightning": TrainSection(steps=8, global_batch=16, eval_every=0),  # 8 per rank on 2 ranks
}


@dataclass(frozen=True)
class MetricsConfig:
    """Observability of a run. Defaults: nothing exported, no barrier (zero cost)."""

    port: int | None = None  # None = no exporter; 0 = a free port per rank; N = N + rank
    host: str = "127.0.0.1"  # loopback: never a public interface unless asked
    skew_barrier_ms: float | None = None  # seed P2; None = off (the seed's value is 1.5)

    def __post_init__(self) -> None:
        if self.port is not None and not 0 <= self.port <= 65535:
            raise BadInput(f"--metrics-port must be in 0..65535; got {self.port}")
        if self.port is not None:
            try:
                socket.getaddrinfo(self.host, None)
            except (socket.gaierror, UnicodeError):
                raise BadInput(f"--metrics-host {self.host!r}: not an address of this "
                               "machine's resolver") from None
        if self.skew_barrier_ms is not None and self.skew_barrier_ms <= 0:
            raise BadInput(f"--skew-barrier-ms must be positive; got {self.skew_barrier_ms}")

    @property
    def enabled(self) -> bool:
        return self.port is not None or self.skew_barrier_ms is not None
