"""Benchmark jobs: one multi-rank job per (strategy, world size), and every figure it yields.

The asv suite in ``benchmarks/`` and ``openclaw-bench compare`` both call this module, so a
number means the same thing wherever it is published. One job is one fresh ``RankPool`` that
runs, in this order:

1. the strategy under test (``train_rank``, the one training loop) — first, so the process's
   peak memory (max RSS on CPU, the allocator peak on CUDA) is the strategy's own;
2. the ``local`` strategy (no sync) on the same ranks: the compute floor. *Exposed sync* is the
   strategy's median step minus this one's, both from the same job;
   (1 and 2 alternate ``rounds`` times, so drifting machine load hits both alike);
3. one step of the strategy again, to read its exact per-step costs (collectives, bytes on the
   wire, host syncs) off the live layout with ``openclaw_ref.sync.costs.step_cost``;
4. a raw flat allreduce of those bytes in the wire dtype: time, algbw = bytes / time and
   busbw = algbw × 2(n−1)/n (nccl-tests' allreduce definition).

Medians exclude the first two steps (the training loop's warm-up rule). Unsupported cases raise
``NotImplementedError`` (asv's skip): a strategy not registered in ``openclaw_ref.sync``, NCCL
without one GPU per rank, or a backend that ``auto`` would not pick on this machine. Speed
targets are evaluated by ``targets()`` and reported, never asserted.

Run without asv: ``python -m openclaw_ref.bench --max-world 4 --out bench.json``.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Mapping, Sequence

import torch
import torch.distributed as dist

from openclaw_ref.environment import environment
from openclaw_ref.errors import BadInput
from openclaw_ref.jsonio import read_json, write_json_atomic
from openclaw_ref.metrics import percentile
from openclaw_ref.launch import LaunchConfig, RankContext, RankPool, resolve_backend
from openclaw_ref.sync.base import SyncConfig

WORLD_SIZES: tuple[int, ...] = (1, 2, 4, 8)
WARMUP_STEPS = 2  # excluded from every median, as the training loop's summary does
REPLICA_CHECK_EVERY = 10  # "all checks on" for the hardened strategies: a digest every 10 steps

# Benchmark label -> the SyncConfig fields of that strategy. Labels are asv parameter values.
STRATEGY_CASES: dict[str, dict] = {
    "ddp": {"name": "ddp"},
    "ddp-fp16": {"name": "ddp-fp16"},
    "hardened-fp32": {"name": "hardened", "wire": "fp32",
                      "replica_check_every": REPLICA_CHECK_EVERY},
    "hardened-fp16": {"name": "hardened", "wire": "fp16",
                      "replica_check_every": REPLICA_CHECK_EVERY},
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


# ---------------------------------------------------------------------------------------------
# Settings


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
        if self.raw_iters < 1:
            raise BadInput(f"raw allreduce iterations must be >= 1; got {self.raw_iters}")
        listed = self.backend_list()
        if listed != ("auto",) and (not listed or any(b not in ("gloo", "nccl") for b in listed)):
            raise BadInput(f"backends must be auto or a list of gloo,nccl; got {self.backends!r}")
        from openclaw_ref.model import PRESETS

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
    def from_env(cls, env: Mapping[str, str] = os.environ) -> "BenchSettings":
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


def sync_config_for(label: str) -> SyncConfig:
    """The SyncConfig of a benchmark label; NotImplementedError when its strategy is not
    registered (yet) in ``openclaw_ref.sync.STRATEGIES`` — skipped, never faked."""
    from openclaw_ref.sync import STRATEGIES

    if label not in STRATEGY_CASES:
        raise NotImplementedError(f"no benchmark case named {label!r}")
    fields = STRATEGY_CASES[label]
    require_registered(fields["name"], STRATEGIES)
    return SyncConfig(**fields)


def require_registered(name: str, registry: Mapping[str, object]) -> None:
    if name not in registry:
        raise NotImplementedError(f"strategy {name!r} is not registered in openclaw_ref.sync")


# ---------------------------------------------------------------------------------------------
# Pure figure arithmetic


def algbw_gbps(nbytes: int, seconds: float) -> float:
    """nccl-tests' algorithm bandwidth: bytes of the buffer ÷ time, in GB/s (10^9)."""
    return nbytes / seconds / 1e9


def busbw_gbps(algbw: float, world_size: int) -> float:
    """nccl-tests' allreduce bus bandwidth: algbw × 2(n−1)/n — what each link carries in a
    ring, comparable across world sizes (0 at one rank: nothing crosses a wire)."""
    return algbw * 2 * (world_size - 1) / world_size


def _timed_steps(records: Sequence[dict]) -> list[float]:
    """Step times of every run after its warm-up steps (the training loop's own rule)."""
    return [s["step_ms"] for r in records for s in r["steps"][WARMUP_STEPS:]]


def sync_figures(steps: Sequence[dict], warmup: int = 2) -> dict:
    """Per-step strategy metrics (the run JSON's ``steps[i]["sync"]``) → medians and rates.
    A figure the strategy does not report is None (the asv track is then skipped)."""
    timed = [s.get("sync") or {} for s in steps[min(len(steps) - 1, warmup):]]
    skews = [b["skew_ms"] for m in timed for b in m.get("buckets", []) if "skew_ms" in b]
    sync_ms = [m["sync_ms"] for m in timed if m.get("sync_ms") is not None]
    verify_ms = [m["verify_ms"] for m in timed if m.get("verify_ms") is not None]
    elements = sum(m.get("elements", 0) for m in timed)
    overflowed = sum(m.get("overflow_elements", 0) for m in timed)
    has_overflow = any("overflow_elements" in m for m in timed)
    return {
        "sync_ms": statistics.median(sync_ms) if sync_ms else None,
        # seed R2 is about the allreduce time's CV: the strategy's own sync time, where reported
        "sync_ms_cv": statistics.pstdev(sync_ms) / statistics.mean(sync_ms)
        if len(sync_ms) > 1 and statistics.mean(sync_ms) > 0 else None,
        "verify_ms": statistics.median(verify_ms) if verify_ms else None,
        "skew_p50_ms": percentile(skews, 50) if skews else None,
        "skew_p99_ms": percentile(skews, 99) if skews else None,
        "overflow_rate": (overflowed / elements) if has_overflow and elements else None,
        "checks_run": sum(m.get("checks_run", 0) for m in timed)
        if any("checks_run" in m for m in timed) else None,
        "checks_passed": sum(m.get("checks_passed", 0) for m in timed)
        if any("checks_passed" in m for m in timed) else None,
    }


def parameter_bytes(preset_name: str, wire: str, seed: int = 1) -> tuple[int, int]:
    """(numel, bytes) of every trainable parameter in the wire dtype: what stock DDP with
    ``find_unused_parameters=True`` allreduces per step (every bucket, every step)."""
    from openclaw_ref.model import build_model, preset

    model = build_model(preset(preset_name, seed=seed))
    numel = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return numel, numel * WIRE_DTYPES[wire].itemsize


# ---------------------------------------------------------------------------------------------
# Rank-side tasks (top-level: spawned ranks import them by name)


def raw_allreduce_rank(ctx: RankContext, numel: int, wire: str, iters: int,
                       warmup: int = 2) -> list[float] | None:
    """Time ``iters`` flat allreduces of ``numel`` elements of the wire dtype. Each iteration
    starts after a barrier and counts until this rank holds the result; the slowest rank's
    time is the iteration's (gathered once at the end). Returns the per-iteration ms on rank 0."""
    x = torch.ones(numel, dtype=WIRE_DTYPES[wire], device=ctx.device)
    for _ in range(warmup):
        dist.all_reduce(x)
    times_ms = []
    for _ in range(iters):
        dist.barrier()
        _device_sync(ctx.device)
        t0 = time.perf_counter()
        dist.all_reduce(x)
        _device_sync(ctx.device)
        times_ms.append((time.perf_counter() - t0) * 1e3)
    slowest = torch.tensor(times_ms, dtype=torch.float64, device=ctx.device)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    return slowest.cpu().tolist() if ctx.is_main else None


def cost_probe_rank(ctx: RankContext, cfg) -> dict | None:
    """Exact per-step costs of ``cfg.sync`` from ``openclaw_ref.sync.costs.step_cost``, read
    off a live strategy after one training step (the layout DDP or the engine really uses).
    Returns rank 0's ``StepCost`` JSON; ``{"unavailable": why}`` when there is no cost model
    (checked on every rank alike, so no rank is left waiting in a collective)."""
    import torch.nn.functional as F

    from openclaw_ref.data import SkillDataset, rank_batch
    from openclaw_ref.model import build_model
    from openclaw_ref.sync import make_strategy

    try:
        from openclaw_ref.sync.costs import step_cost
    except ImportError:
        return {"unavailable": "openclaw_ref.sync.costs is not installed"}
    model_cfg = cfg.model_config()
    ds = SkillDataset(model_cfg, dataclasses.replace(cfg.data, seed=cfg.seed))
    strategy = make_strategy(cfg.sync)
    module = strategy.wrap(build_model(model_cfg).to(ctx.device), ctx)
    try:
        batch = rank_batch(ds, 0, cfg.global_batch, ctx.rank, ctx.world_size).to(ctx.device)
        strategy.begin_step(0)
        F.cross_entropy(module(batch.tokens, batch.sample_ids, 0), batch.labels).backward()
        strategy.finish_step(0)
        try:
            cost = step_cost(strategy, ctx.world_size).to_json()
        except ValueError as exc:  # a strategy the cost model does not know
            cost = {"unavailable": str(exc)}
    finally:
        strategy.close()
    return cost if ctx.is_main else None


def costs_from_probe(probe: dict | None, preset_name: str, wire: str, seed: int) -> dict:
    """The cost columns of a case: the cost model's figures, or — without one — only the
    bytes, counted from the parameters (``bytes_source`` says which)."""
    if probe and "unavailable" not in probe:
        return {"collectives_per_step": probe["collectives"],
                "wire_bytes_per_step": probe["wire_bytes"],
                "host_syncs_per_step": probe["host_syncs"],
                "periodic_collectives": probe.get("periodic_collectives"),
                "cost_notes": probe.get("notes", ""), "bytes_source": "costs"}
    return {"collectives_per_step": None,
            "wire_bytes_per_step": parameter_bytes(preset_name, wire, seed)[1],
            "host_syncs_per_step": None, "periodic_collectives": None,
            "cost_notes": (probe or {}).get("unavailable", ""), "bytes_source": "parameters"}


def _device_sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# ---------------------------------------------------------------------------------------------
# Jobs


@dataclass(frozen=True)
class Case:
    """One benchmark cell: a strategy label (or a seed-004 precision) at a world size."""

    kind: str  # "sync" or "seed004"
    label: str
    world_size: int
    backend: str

    @property
    def key(self) -> str:
        return f"{self.kind}-{self.label}-w{self.world_size}-{self.backend}"


def _train_config(settings: BenchSettings, world_size: int, backend: str, sync: SyncConfig,
                  amp: str | None = None):
    """The training run of a benchmark. Validation is cut to one sample: the loop always ends
    with a validation forward, and on the full split that forward would cost more than the
    timed steps and set every rank's peak memory, hiding the strategies' differences."""
    from openclaw_ref.data import DataConfig
    from openclaw_ref.train import TrainConfig

    return TrainConfig(preset=settings.preset, world_size=world_size, steps=settings.steps,
                       global_batch=settings.global_batch, seed=settings.seed, eval_every=0,
                       sync=sync, data=DataConfig(n_val=1), backend=backend,
                       timeout_s=settings.timeout_s, progress=False, amp=amp)


def _pool(world_size: int, backend: str, settings: BenchSettings) -> RankPool:
    return RankPool(LaunchConfig(world_size, backend=backend, timeout_s=settings.timeout_s,
                                 pg_timeout_s=120.0, threads_per_rank=settings.threads or None))


def run_sync_case(label: str, world_size: int, backend: str, settings: BenchSettings,
                  pool: RankPool | None = None) -> dict:
    """Run one (strategy, world size) job and return every figure it yields (JSON-able).

    ``pool``: run on these ranks instead of a fresh pool (tests do, to reuse their pools);
    the peak-memory figure then includes whatever those processes held before."""
    from openclaw_ref.train import train_rank

    sync = sync_config_for(label)
    backend = backend_for(world_size, backend, settings)
    wire = "fp16" if sync.name == "ddp-fp16" else sync.wire
    train_cfg = _train_config(settings, world_size, backend, sync)
    own = pool is None
    pool = pool or _pool(world_size, backend, settings)
    records, floors = [], []
    try:
        t0 = time.perf_counter()
        for _ in range(settings.rounds):  # alternate, so drift in machine load hits both alike
            records.append(pool.run(train_rank, train_cfg)[0])
            floors.append(pool.run(train_rank, _train_config(settings, world_size, backend,
                                                             SyncConfig(name="local")))[0])
        costs = costs_from_probe(pool.run(cost_probe_rank, train_cfg)[0], settings.preset,
                                 wire, settings.seed)
        # the same bytes as one flat buffer, in the wire dtype
        numel = max(1, costs["wire_bytes_per_step"] // WIRE_DTYPES[wire].itemsize)
        raw_ms = pool.run(raw_allreduce_rank, numel, wire, settings.raw_iters)[0]
        job_s = time.perf_counter() - t0
    finally:
        if own:
            pool.close()
    timed, floor_timed = _timed_steps(records), _timed_steps(floors)
    step_ms, floor_ms = statistics.median(timed), statistics.median(floor_timed)
    summary = records[0]["summary"]  # the first run: its peak memory is the strategy's own
    raw = statistics.median(raw_ms)
    nbytes = numel * WIRE_DTYPES[wire].itemsize
    algbw = algbw_gbps(nbytes, raw / 1e3)
    exposed = step_ms - floor_ms
    figures = {
        "kind": "sync", "strategy": label, "world_size": world_size, "backend": backend,
        "sync_config": dataclasses.asdict(sync),
        "median_step_ms": step_ms,
        "local_median_step_ms": floor_ms,
        "exposed_sync_ms": exposed,
        "step_ms_cv": statistics.pstdev(timed) / statistics.mean(timed) if len(timed) > 1
        else 0.0,
        "peak_memory_mb": max(summary["peak_memory_mb"]),
        "peak_memory_mb_per_rank": summary["peak_memory_mb"],
        "replicas_equal": all(r["summary"]["replicas_equal"] for r in records),
        "skipped_step_rate": sum(r["summary"]["skipped_steps"] for r in records)
        / sum(len(r["steps"]) for r in records),
        "events": sum(len(r["events"]) for r in records),
        "raw_allreduce_ms": raw,
        "raw_allreduce_bytes": nbytes,
        "raw_allreduce_dtype": wire,
        "raw_algbw_gbps": algbw if world_size > 1 else None,
        "raw_busbw_gbps": busbw_gbps(algbw, world_size) if world_size > 1 else None,
        "sync_over_raw": exposed / raw if world_size > 1 and raw > 0 else None,
        "step_ms": [[s["step_ms"] for s in r["steps"]] for r in records],
        "local_step_ms": [[s["step_ms"] for s in r["steps"]] for r in floors],
        "job_s": job_s,
        "pool_reused": not own,
    }
    figures.update(sync_figures([s for r in records for s in r["steps"][WARMUP_STEPS:]],
                                warmup=0))
    figures.update(costs)
    return figures


def run_seed004_case(precision: str, world_size: int, backend: str, settings: BenchSettings,
                     pool: RankPool | None = None) -> dict:
    """Seed 004's table (claim L3): s/iter and peak memory per rank. One rank runs without a
    wrapper (``local``: the single-device flow), N ranks run DDP. AMP is bf16 autocast on CPU
    and fp16 on GPU, as in the seed's ``precision=16``."""
    from openclaw_ref.train import train_rank

    if precision not in PRECISIONS:
        raise NotImplementedError(f"no precision {precision!r}; choose one of {PRECISIONS}")
    backend = backend_for(world_size, backend, settings)
    amp = None if precision == "fp32" else ("fp16" if backend == "nccl" else "bf16")
    sync = SyncConfig(name="local" if world_size == 1 else "ddp")
    own = pool is None
    pool = pool or _pool(world_size, backend, settings)
    train_cfg = _train_config(settings, world_size, backend, sync, amp)
    try:
        records = [pool.run(train_rank, train_cfg)[0] for _ in range(settings.rounds)]
    finally:
        if own:
            pool.close()
    summary = records[0]["summary"]  # the first run's peak memory is this case's own
    return {
        "kind": "seed004", "precision": precision, "amp_dtype": amp, "world_size": world_size,
        "backend": backend, "strategy": sync.name,
        "s_per_iter": statistics.median(_timed_steps(records)) / 1e3,
        "peak_memory_mb": max(summary["peak_memory_mb"]),
        "peak_memory_mb_per_rank": summary["peak_memory_mb"],
        "peak_memory_scope": summary.get("peak_memory_scope", "process"),
        "final_loss": summary["final_loss"],
    }


class CaseCache:
    """Figures of finished jobs as JSON files in one directory, so the many figures of one job
    cost one job. asv runs every ``track_*`` in a fresh process, with the working directory set
    to the directory ``setup_cache`` made for this run (deleted when the run ends): that is the
    directory to use there. Skips and failures are cached too, so a case is attempted once."""

    def __init__(self, directory: str | os.PathLike) -> None:
        self.directory = Path(directory)

    def get(self, key: str, compute: Callable[[], dict]) -> dict:
        path = self.directory / f"{key}.json"
        if path.exists():
            entry = read_json(path)
        else:
            try:
                entry = {"figures": compute()}
            except NotImplementedError as exc:
                entry = {"skip": str(exc)}
            except Exception as exc:  # recorded once; every figure of the case then fails
                entry = {"error": f"{type(exc).__name__}: {exc}"}
            self.directory.mkdir(parents=True, exist_ok=True)
            write_json_atomic(path, entry)
        if "skip" in entry:
            raise NotImplementedError(entry["skip"])
        if "error" in entry:
            raise RuntimeError(f"benchmark job {key} failed: {entry['error']}")
        return entry["figures"]


def case_figures(case: Case, settings: BenchSettings, cache: CaseCache) -> dict:
    """Cached figures of ``case`` (runs its job the first time)."""
    key = f"{case.key}-{settings.digest()}"
    if case.kind == "sync":
        return cache.get(key, lambda: run_sync_case(case.label, case.world_size,
                                                         case.backend, settings))
    if case.kind == "seed004":
        return cache.get(key, lambda: run_seed004_case(case.label, case.world_size,
                                                            case.backend, settings))
    raise NotImplementedError(f"unknown case kind {case.kind!r}")


# ---------------------------------------------------------------------------------------------
# Targets (reported, never asserted)


@dataclass
class TargetRow:
    target: str
    world_size: int
    value: float | None
    threshold: float
    met: bool | None  # None: not measurable here (a strategy missing, or the premise fails)
    note: str = ""


def targets(cases: Iterable[dict]) -> list[TargetRow]:
    """Issue 4's targets from the figures of one run, per world size 2–8.

    Comparisons across jobs use *exposed* sync where they can: each is already corrected by
    the no-sync floor of its own job, so load drifting between jobs cancels. The step ratio is
    reported as defined (step ÷ step) with the floor-corrected ratio in its note."""
    by = {(c["strategy"], c["world_size"]): c for c in cases if c.get("kind") == "sync"}
    rows: list[TargetRow] = []
    for w in sorted({w for _, w in by if w >= 2}):
        ddp, hard = by.get(("ddp", w)), by.get(("hardened-fp32", w))
        detail = by.get(("ddp-detail", w))
        rows.append(_step_ratio_row(w, hard, ddp))
        if hard and ddp and detail:
            mine = hard["exposed_sync_ms"] - ddp["exposed_sync_ms"]
            theirs = detail["exposed_sync_ms"] - ddp["exposed_sync_ms"]
            if theirs > 0:
                value = mine / theirs
                rows.append(TargetRow("hardened check overhead / DETAIL's", w, value, 0.1,
                                      value <= 0.1, f"{mine:+.1f} ms vs {theirs:+.1f} ms"))
            else:
                rows.append(TargetRow("hardened check overhead / DETAIL's", w, None, 0.1, None,
                                      f"DETAIL measured no overhead ({theirs:+.1f} ms)"))
        else:
            rows.append(TargetRow("hardened check overhead / DETAIL's", w, None, 0.1, None,
                                  "needs ddp, hardened-fp32 and ddp-detail"))
        for label in ("hardened-fp32", "ddp"):
            c = by.get((label, w))
            value = c.get("sync_over_raw") if c else None
            rows.append(TargetRow(f"{label} exposed sync / raw allreduce", w, value, 1.2,
                                  None if value is None else value <= 1.2,
                                  "" if c else f"no {label} result"))
        for fp16, fp32 in (("hardened-fp16", "hardened-fp32"), ("ddp-fp16", "ddp")):
            rows.append(_fp16_row(w, by.get((fp16, w)), by.get((fp32, w)), fp16, fp32))
    return rows


def _step_ratio_row(w: int, hard: dict | None, ddp: dict | None) -> TargetRow:
    name = "hardened fp32 step / ddp step"
    if not (hard and ddp):
        return TargetRow(name, w, None, 1.03, None, "a strategy has no result")
    value = hard["median_step_ms"] / ddp["median_step_ms"]
    floor = ddp["local_median_step_ms"]
    corrected = (floor + hard["exposed_sync_ms"]) / (floor + ddp["exposed_sync_ms"])
    return TargetRow(name, w, value, 1.03, value <= 1.03,
                     f"floor-corrected (ddp's floor + each exposed sync): {corrected:.3f}")


def _fp16_row(w: int, fp16: dict | None, fp32: dict | None, l16: str, l32: str) -> TargetRow:
    """fp16 wire ≤ 0.6 × fp32 sync time, where the link is bandwidth-bound: judged by the raw
    allreduce itself — half the bytes must take ≤ 0.6× the time, or the premise fails here."""
    name = f"{l16} sync / {l32} sync"
    if not (fp16 and fp32):
        return TargetRow(name, w, None, 0.6, None, "a strategy has no result")
    value = fp16["exposed_sync_ms"] / fp32["exposed_sync_ms"] if fp32["exposed_sync_ms"] > 0 \
        else None
    raw_ratio = fp16["raw_allreduce_ms"] / fp32["raw_allreduce_ms"]
    if raw_ratio > 0.6:
        return TargetRow(name, w, value, 0.6, None,
                         f"not bandwidth-bound: raw allreduce of half the bytes took "
                         f"{raw_ratio:.2f}× the time")
    return TargetRow(name, w, value, 0.6, None if value is None else value <= 0.6,
                     f"raw half-bytes ratio {raw_ratio:.2f}")


# ---------------------------------------------------------------------------------------------
# The whole matrix, without asv (what `openclaw-bench compare` calls)


def run_matrix(settings: BenchSettings, strategies: Sequence[str] | None = None,
               world_sizes: Sequence[int] | None = None, seed004: bool = True,
               progress: Callable[[str], None] | None = None,
               cache: CaseCache | None = None) -> dict:
    """Every case of the matrix, the targets, and the environment, as one JSON-able dict.
    ``strategies``: benchmark labels (default: all of ``STRATEGY_CASES``; empty: none).
    Skipped cases are listed with their reason, failed ones with their error; a failure does
    not stop the matrix. ``cache``: reuse/keep per-case figures (e.g. resume an interrupted run).
    """
    labels = list(STRATEGY_CASES) if strategies is None else list(strategies)
    worlds = [w for w in (world_sizes or settings.world_sizes)]
    cases: list[Case] = [Case("sync", s, w, b) for w in worlds for s in labels
                         for b in settings.backend_params()]
    if seed004:
        cases += [Case("seed004", p, w, b) for w in worlds for p in PRECISIONS
                  for b in settings.backend_params()]
    results, skipped, failed = [], [], []
    for i, case in enumerate(cases):
        if progress:
            progress(f"[{i + 1}/{len(cases)}] {case.key}")
        try:
            if cache is not None:
                results.append(case_figures(case, settings, cache))
            elif case.kind == "sync":
                results.append(run_sync_case(case.label, case.world_size, case.backend, settings))
            else:
                results.append(run_seed004_case(case.label, case.world_size, case.backend,
                                                settings))
        except NotImplementedError as exc:
            skipped.append({"case": case.key, "reason": str(exc)})
        except Exception as exc:
            failed.append({"case": case.key, "error": f"{type(exc).__name__}: {exc}"})
    sync_cases = [r for r in results if r["kind"] == "sync"]
    return {
        "settings": settings.to_json(),
        "environment": environment(",".join(settings.backend_params()), max(worlds)),
        "cases": sync_cases,
        "seed004": [r for r in results if r["kind"] == "seed004"],
        "targets": [dataclasses.asdict(t) for t in targets(sync_cases)],
        "skipped": skipped,
        "failed": failed,
    }


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m openclaw_ref.bench",
                                description="the asv benchmark matrix without asv, as JSON")
    defaults = BenchSettings.from_env()
    p.add_argument("--preset", default=defaults.preset)
    p.add_argument("--steps", type=int, default=defaults.steps)
    p.add_argument("--global-batch", type=int, default=defaults.global_batch)
    p.add_argument("--max-world", type=int, default=defaults.max_world)
    p.add_argument("--backends", default=defaults.backends)
    p.add_argument("--raw-iters", type=int, default=defaults.raw_iters)
    p.add_argument("--rounds", type=int, default=defaults.rounds)
    p.add_argument("--threads", type=int, default=defaults.threads,
                   help="torch threads per rank (0: cores // ranks)")
    p.add_argument("--strategies", default=",".join(STRATEGY_CASES),
                   help="comma list of benchmark labels; empty for none")
    p.add_argument("--no-seed004", action="store_true")
    p.add_argument("--cache-dir", default=None, help="keep per-case JSON here (resumable)")
    p.add_argument("--out", default=None, help="write the matrix JSON here")
    p.add_argument("--markdown", default=None, help="write the tables here")
    args = p.parse_args(argv)
    try:
        settings = BenchSettings(preset=args.preset, steps=args.steps,
                                 global_batch=args.global_batch, max_world=args.max_world,
                                 backends=args.backends, raw_iters=args.raw_iters,
                                 rounds=args.rounds, threads=args.threads)
    except BadInput as exc:
        p.error(str(exc))
    result = run_matrix(settings, [s for s in args.strategies.split(",") if s],
                        seed004=not args.no_seed004,
                        progress=lambda m: print(m, file=sys.stderr, flush=True),
                        cache=CaseCache(args.cache_dir) if args.cache_dir else None)
    from openclaw_ref.report import bench_matrix_markdown

    tables = bench_matrix_markdown(result)
    if args.out:
        write_json_atomic(args.out, result)
    if args.markdown:
        Path(args.markdown).write_text(tables)
    print(tables)
    return 1 if result["failed"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
