"""What one benchmark run shares: its settings, the benchmark labels and how a case's backend is
chosen.

Unsupported cases raise ``NotImplementedError`` (asv's skip), never a faked number: a strategy
not registered in ``openclaw_ref.arms``, NCCL without one GPU per rank, or a backend that
``auto`` would not pick on this machine.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from openclaw_ref.arms.config import ArmConfig
from openclaw_ref.core.launch import resolve_backend
from openclaw_ref.sync.errors import BadInput

WORLD_SIZES: tuple[int, ...] = (1, 2, 4, 8)
REPLICA_CHECK_EVERY = 10  # "all checks on" for bucketed: a replica check every 10 steps
# (hardened compares replicas by default: SyncConfig.replica_slices, in its step block)

# Benchmark label -> the ArmConfig fields of that strategy (``ArmConfig.of``). Labels are asv
# parameter values.
STRATEGY_CASES: dict[str, dict] = {
    "ddp": {"name": "ddp"},
    "ddp-fp16": {"name": "ddp-fp16"},
    "hardened-fp32": {"name": "hardened", "wire": "fp32"},
    "hardened-fp16": {"name": "hardened", "wire": "fp16"},  # the step guard: DDP's fp16 wire
    "bucketed-static": {"name": "bucketed", "planner": "static",
                        "replica_check_every": REPLICA_CHECK_EVERY},
    "bucketed-norm-ema-agreed": {"name": "bucketed", "planner": "norm-ema-agreed",
                                 "replica_check_every": REPLICA_CHECK_EVERY},
    "ddp-detail": {"name": "ddp-detail"},
}
PRECISIONS = ("fp32", "amp")  # seed 004's matrix (claim L3)
WIRE_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16,
               "native": torch.float32}  # native: the openclaw model's fp32 gradients

ENV_PREFIX = "OPENCLAW_BENCH_"


@dataclass(frozen=True)
class BenchSettings:
    """What every job of one benchmark run shares. ``from_env`` is how asv gets them: asv's
    parameters are fixed at import, so the knobs are environment variables (``OPENCLAW_BENCH_*``).
    """

    preset: str = "small"
    steps: int = 12  # per training run; the first 2 are warm-up and excluded from medians
    global_batch: int = 16  # divisible by every world size up to 8
    seed: int = 1
    max_world: int = 8
    backends: str = "auto"  # "auto", or a comma list of gloo/nccl to run each where possible
    raw_iters: int = 10
    rounds: int = 2  # strategy/local runs alternate this many times in one job
    # torch threads per rank; 0 = the launcher's cores // ranks. One thread per rank keeps a
    # job from oversubscribing cores it shares (two threads per rank on a busy 2-core machine
    # made 1-rank steps vary 20×); it is also how the shared torch facts were measured.
    threads: int = 1
    timeout_s: float = 900.0  # one job
    # timed steps per arm of each interleaved hook-cost job (``experiments/hook_cost.py``), one
    # job per asv round: 300 steps gave the mlp figure ±2 % between jobs on 2 shared cores
    hook_steps: int = 300

    def __post_init__(self) -> None:
        if self.steps < 3:
            raise BadInput(f"bench steps must be >= 3 (2 warm-up + 1 timed); got {self.steps}")
        if self.max_world < 1:
            raise BadInput(f"max world size must be >= 1; got {self.max_world}")
        if self.global_batch < 1 or any(self.global_batch % w for w in self.world_sizes):
            raise BadInput(f"global batch {self.global_batch} must be a positive multiple of "
                           f"every world size in {self.world_sizes}")
        if self.threads < 0:
            raise BadInput(f"threads per rank must be >= 0 (0 = automatic); got {self.threads}")
        if self.rounds < 1:
            raise BadInput(f"rounds must be >= 1; got {self.rounds}")
        if self.hook_steps < 5:
            raise BadInput(f"hook-cost steps must be >= 5; got {self.hook_steps}")
        if self.raw_iters < 1:
            raise BadInput(f"raw allreduce iterations must be >= 1; got {self.raw_iters}")
        listed = self.backend_list()
        if listed != ("auto",) and (not listed or any(b not in ("gloo", "nccl") for b in listed)):
            raise BadInput(f"backends must be auto or a list of gloo,nccl; got {self.backends!r}")
        from openclaw_ref.core.model import PRESETS

        if self.preset not in PRESETS:
            raise BadInput(f"unknown preset {self.preset!r}; choose one of {', '.join(PRESETS)}")

    @property
    def world_sizes(self) -> tuple[int, ...]:
        return tuple(w for w in WORLD_SIZES if w <= self.max_world)

    def backend_list(self) -> tuple[str, ...]:
        return tuple(b.strip() for b in self.backends.split(",") if b.strip())

    def backend_params(self) -> tuple[str, ...]:
        """The backend values a matrix iterates over: what ``auto`` picks somewhere in
        ``world_sizes`` (gloo only, on a machine without CUDA), or the explicit list."""
        if self.backend_list() != ("auto",):
            return self.backend_list()
        picked = {auto_backend(w) for w in self.world_sizes}
        return tuple(b for b in ("nccl", "gloo") if b in picked)

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> BenchSettings:
        kwargs: dict = {}
        for f in dataclasses.fields(cls):
            raw = env.get(ENV_PREFIX + f.name.upper())
            if raw is None or raw == "":
                continue
            try:
                kwargs[f.name] = type(f.default)(raw)
            except ValueError:
                raise BadInput(f"{ENV_PREFIX}{f.name.upper()}={raw!r} is not a valid "
                               f"{type(f.default).__name__}") from None
        return cls(**kwargs)

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    def digest(self) -> str:
        """What a case's figures depend on (not which world sizes or backends a matrix spans),
        so a cache directory never serves figures measured under other settings."""
        import hashlib
        import json

        d = {k: v for k, v in self.to_json().items() if k not in ("max_world", "backends")}
        return hashlib.sha1(json.dumps(d, sort_keys=True).encode()).hexdigest()[:10]


def auto_backend(world_size: int) -> str:
    """NCCL with one GPU per rank when that many GPUs exist, else gloo (the launcher's rule)."""
    return resolve_backend("auto", world_size)


def backend_for(world_size: int, backend: str, settings: BenchSettings) -> str:
    """The backend a case runs on, or NotImplementedError when the combination is unsupported
    here (NCCL without enough GPUs) or is not what ``auto`` picks in an auto matrix."""
    if backend == "nccl":
        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if gpus < world_size:
            raise NotImplementedError(f"nccl needs {world_size} GPUs; this machine has {gpus}")
    elif backend != "gloo":
        raise NotImplementedError(f"unknown backend {backend!r}")
    if settings.backend_list() == ("auto",) and backend != auto_backend(world_size):
        raise NotImplementedError(f"auto picks {auto_backend(world_size)} at {world_size} ranks")
    return backend


def sync_config_for(label: str) -> ArmConfig:
    """The ArmConfig of a benchmark label; NotImplementedError when its strategy is not
    registered (yet) in ``openclaw_ref.arms.registry.STRATEGIES`` — skipped, never faked."""
    from openclaw_ref.arms.registry import STRATEGIES

    if label not in STRATEGY_CASES:
        raise NotImplementedError(f"no benchmark case named {label!r}")
    fields = STRATEGY_CASES[label]
    require_registered(fields["name"], STRATEGIES)
    return ArmConfig.of(**fields)


def require_registered(name: str, registry: Mapping[str, object]) -> None:
    if name not in registry:
        raise NotImplementedError(f"strategy {name!r} is not registered in openclaw_ref.arms")
