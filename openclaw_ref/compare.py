"""``openclaw-bench compare``: the main comparison, run at this machine's scale.

It trains the openclaw model under every sync strategy on every world size (interleaved and
repeated, because sync variants differ by less than the timing noise here), runs the fault
matrix, the precision matrix of seed 004 and the overflow sweep, and stores everything as one
raw JSON with its environment. Rendering (tables, plots, the claims ledger) is ``report.py``'s
job and reads only that JSON, so ``openclaw-bench report`` reproduces every file byte for byte.

Nothing under ``results/<machine>/`` changes until every section has finished: an interrupted
run leaves the previous results intact and says which sections it did not finish.
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from openclaw_ref.environment import environment
from openclaw_ref.errors import BadInput, ConsistencyError, RankFailed
from openclaw_ref.launch import LaunchConfig, RankContext, RankPool, resolve_backend
from openclaw_ref.metrics import percentile
from openclaw_ref.sync import STRATEGIES
from openclaw_ref.sync.base import SyncConfig
from openclaw_ref.train import TrainConfig, train_model

RAW_NAME = "raw.json"


@dataclass(frozen=True)
class Variant:
    """One row label of the comparison: a strategy with its knobs."""

    label: str
    sync: SyncConfig

    @property
    def available(self) -> bool:
        return self.sync.name in STRATEGIES


def default_variants(bucket_cap_mb: float) -> tuple[Variant, ...]:
    def v(label: str, **kw: Any) -> Variant:
        return Variant(label, SyncConfig(bucket_cap_mb=bucket_cap_mb, **kw))

    return (
        v("local (no sync)", name="local"),
        v("ddp", name="ddp"),
        v("ddp-fp16", name="ddp-fp16"),
        v("hardened fp32", name="hardened", wire="fp32", replica_check_every=10),
        v("hardened fp16", name="hardened", wire="fp16", replica_check_every=10),
        v("hardened bf16", name="hardened", wire="bf16", replica_check_every=10),
        v("bucketed static", name="bucketed", planner="static"),
        v("bucketed norm-ema-agreed", name="bucketed", planner="norm-ema-agreed"),
        v("bucketed norm-ema (seed F2)", name="bucketed", planner="norm-ema"),
    )


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
    repeats: int = 3
    global_batch: int = 32
    bucket_cap_mb: float = 0.025  # the tiny model is 0.15 MB: this cap gives it ~6 buckets
    curve_steps: int = 300
    curve_world_size: int = 2
    seed: int = 1
    backend: str = "auto"
    sections: tuple[str, ...] = ("strategies", "curves", "faults", "precision", "overflow",
                                 "raw_allreduce", "ablations")
    out_root: str = "results"
    tag: str | None = None

    def validate(self) -> None:
        if not self.world_sizes or min(self.world_sizes) < 1:
            raise BadInput("world sizes must be >= 1")
        for w in self.world_sizes:
            if self.global_batch % w:
                raise BadInput(f"global batch {self.global_batch} not divisible by world size {w}")
        if self.steps < 5 or self.repeats < 1:
            raise BadInput("need steps >= 5 and repeats >= 1")
        unknown = set(self.sections) - set(SECTIONS)
        if unknown:
            raise BadInput(f"unknown sections {sorted(unknown)}; known: {', '.join(SECTIONS)}")
        resolve_backend(self.backend, max(self.world_sizes))

    def out_dir(self) -> Path:
        return Path(self.out_root) / (self.tag or machine_tag(self.backend, max(self.world_sizes)))


def machine_tag(backend: str, world_size: int) -> str:
    """Names the machine class a result belongs to, e.g. ``cpu2-gloo`` or ``8xH100-nccl``."""
    backend = resolve_backend(backend, world_size)
    if backend == "nccl":
        name = torch.cuda.get_device_name(0).replace("NVIDIA ", "").split()[0]
        return f"{torch.cuda.device_count()}x{name}-nccl"
    return f"cpu{os.cpu_count()}-{backend}"


# ---------------------------------------------------------------------------------------------
# Rank tasks (top-level so spawned ranks can import them)


def run_and_return_params(ctx: RankContext, cfg: TrainConfig) -> dict | None:
    """Train; rank 0 returns its record plus its final parameters for the correctness column."""
    result = train_model(ctx, cfg)
    if not ctx.is_main:
        return None
    params = {n: p.detach().to("cpu").clone() for n, p in result.model.named_parameters()}
    return {"record": result.record, "params": params}


# ---------------------------------------------------------------------------------------------
# Sections


@dataclass
class Progress:
    """Counts jobs across sections; a tqdm bar when it is a terminal, lines otherwise."""

    total: int
    done: int = 0
    _bar: Any = None

    def __post_init__(self) -> None:
        from tqdm import tqdm

        self._bar = tqdm(total=self.total, unit="job", desc="compare", mininterval=1.0)

    def tick(self, what: str) -> None:
        self.done += 1
        self._bar.set_postfix_str(what[:60])
        self._bar.update(1)

    def close(self) -> None:
        self._bar.close()


def _max_abs_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return max(float((a[n].float() - b[n].float()).abs().max()) for n in a)


def slim_run(record: dict) -> dict:
    """The figures of one run that the tables and the ledger need (steps kept compactly)."""
    steps = record["steps"]
    skews = [b["skew_ms"] for s in steps for b in s["sync"].get("buckets", [])
             if b.get("skew_ms") is not None]
    norms = {n: [s["grad_norms"][n] for s in steps] for n in steps[0]["grad_norms"]}
    return {
        "summary": record["summary"],
        "events": record["events"],
        "step_ms": [s["step_ms"] for s in steps],
        "rank_step_ms": [s["rank_step_ms"] for s in steps],
        "loss": [s["loss"] for s in steps],
        "applied": [s["applied"] for s in steps],
        "missing_grads": [s["missing_grads"] for s in steps],
        "grad_presence_agrees": [s["grad_presence_agrees"] for s in steps],
        "realized_sparsity": [s["realized_sparsity"] for s in steps],
        "mask_entropy_bits": [s["mask_entropy_bits"] for s in steps],
        "skew_ms": skews,
        "skew_p50_ms": percentile(skews, 50) if skews else None,
        "skew_p99_ms": percentile(skews, 99) if skews else None,
        "grad_norms": norms,
        "sync_last": steps[-1]["sync"],
        "validation": record.get("validation", []),
    }


def section_strategies(cfg: CompareConfig, pools: "PoolSet", progress: Progress,
                       variants: tuple[Variant, ...]) -> dict:
    """Every variant × world size, repeated and interleaved (variant order rotates per repeat)."""
    base = TrainConfig(preset=cfg.preset, steps=cfg.steps, global_batch=cfg.global_batch,
                       seed=cfg.seed, eval_every=0, progress=False, backend=cfg.backend)
    reference = pools.get(1).run(run_and_return_params,
                             dataclasses.replace(base, world_size=1,
                                                 sync=SyncConfig(name="local")))[0]["params"]
    progress.tick("reference: 1 process")
    runs: list[dict] = []
    for repeat in range(cfg.repeats):
        for w in cfg.world_sizes:
            order = list(variants[repeat % len(variants):] + variants[:repeat % len(variants)])
            for variant in order:
                if not variant.available:
                    progress.tick(f"{variant.label} (not available)")
                    continue
                tcfg = dataclasses.replace(base, world_size=w, sync=variant.sync)
                row = {"variant": variant.label, "sync": dataclasses.asdict(variant.sync),
                       "world_size": w, "repeat": repeat}
                try:
                    out = pools.get(w).run(run_and_return_params, tcfg)[0]
                except RankFailed as exc:  # a strategy that fails is a result, not a crash
                    if isinstance(exc.cause, ConsistencyError):
                        row["stopped_by"] = exc.cause.event().to_json()
                    row["error"] = exc.summary
                else:
                    row.update(slim_run(out["record"]))
                    row["max_abs_diff_vs_reference"] = _max_abs_diff(out["params"], reference)
                    if repeat == 0:
                        row["costs"] = _costs(pools, tcfg)
                runs.append(row)
                progress.tick(f"{variant.label} ×{w} r{repeat}")
    return {"runs": runs, "reference": "1 process, no sync, same global batch and seed"}


def section_curves(cfg: CompareConfig, pools: "PoolSet", progress: Progress) -> dict:
    """Long runs with frequent validation: does the seed's C1 spike pattern appear?"""
    w = cfg.curve_world_size if cfg.curve_world_size in cfg.world_sizes else max(cfg.world_sizes)
    out = {}
    for label, sync in (("ddp", SyncConfig(name="ddp")),
                        ("hardened fp32", SyncConfig(name="hardened", bucket_cap_mb=cfg.bucket_cap_mb))):
        if sync.name not in STRATEGIES:
            progress.tick(f"curve {label} (not available)")
            continue
        tcfg = TrainConfig(preset=cfg.preset, world_size=w, steps=cfg.curve_steps,
                           global_batch=cfg.global_batch, seed=cfg.seed, eval_every=2,
                           progress=False, sync=sync, backend=cfg.backend)
        record = pools.get(w).run(run_and_return_params, tcfg)[0]["record"]
        out[label] = {"world_size": w, **slim_run(record)}
        progress.tick(f"curve {label}")
    return out


SECTIONS: dict[str, str] = {
    "strategies": "every strategy × world size, repeated",
    "curves": "long loss/validation curves, ddp vs hardened",
    "faults": "fault × strategy outcome matrix",
    "precision": "seed 004's precision × devices matrix",
    "overflow": "fp16 overflow rate vs scale",
    "raw_allreduce": "raw flat allreduce of the same bytes",
    "ablations": "skew with the sparse path off; the seed's P2 barrier on vs off",
}


def _pool(cfg: CompareConfig, world_size: int) -> RankPool:
    return RankPool(LaunchConfig(world_size, backend=cfg.backend, timeout_s=900,
                                 pg_timeout_s=120))


def run_compare(cfg: CompareConfig, variants: tuple[Variant, ...] | None = None) -> dict:
    """Run every requested section; returns the raw document (not yet written)."""
    cfg.validate()
    variants = variants or default_variants(cfg.bucket_cap_mb)
    n_jobs = sum(SECTION_JOBS[name](cfg, variants) for name in cfg.sections)
    progress = Progress(n_jobs)
    raw: dict[str, Any] = {
        "meta": {
            "environment": environment(resolve_backend(cfg.backend, max(cfg.world_sizes)),
                                       max(cfg.world_sizes)),
            "compare_config": dataclasses.asdict(cfg),
            "sections_run": [], "sections_skipped": {},
        },
    }
    pools: dict[int, RankPool] = {}
    started = time.monotonic()
    current = "starting rank pools"
    try:
        for w in sorted(set(cfg.world_sizes) | {1}):
            pools[w] = _pool(cfg, w)
        for name in cfg.sections:
            current = name
            t0 = time.monotonic()
            if name == "strategies":
                raw[name] = section_strategies(cfg, PoolSet(cfg, pools), progress, variants)
            else:
                raw[name] = SECTION_RUNNERS[name](cfg, PoolSet(cfg, pools), progress)
            raw["meta"]["sections_run"].append({"name": name,
                                                "seconds": round(time.monotonic() - t0, 1)})
    except KeyboardInterrupt:
        done = [s["name"] for s in raw["meta"]["sections_run"]]
        raise CompareInterrupted(done, [n for n in cfg.sections if n not in done], current) \
            from None
    finally:
        progress.close()
        for pool in pools.values():
            pool.close()
    raw["meta"]["wall_s"] = round(time.monotonic() - started, 1)
    return raw


class CompareInterrupted(Exception):
    """Ctrl-C during a comparison: nothing was written; says what had and had not finished."""

    def __init__(self, done: list[str], pending: list[str], current: str) -> None:
        self.done, self.pending, self.current = done, pending, current
        super().__init__(f"interrupted during {current!r}; finished: {done or 'nothing'}; "
                         f"not finished: {pending}")


def write_results(raw: dict, out_dir: Path) -> list[Path]:
    """Store the raw document, then render every derived file from it (each write atomic)."""
    from openclaw_ref.jsonio import write_json_atomic
    from openclaw_ref.report import render_all

    write_json_atomic(out_dir / RAW_NAME, raw)
    return [out_dir / RAW_NAME] + render_all(out_dir)


class PoolSet:
    """The comparison's rank pools by world size; a pool a fault broke is replaced on demand."""

    def __init__(self, cfg: CompareConfig, pools: dict[int, RankPool]) -> None:
        self.cfg, self.pools = cfg, pools

    def get(self, world_size: int) -> RankPool:
        pool = self.pools.get(world_size)
        if pool is None or pool.broken:
            pool = self.pools[world_size] = _pool(self.cfg, world_size)
        return pool


def _costs(pools: PoolSet, tcfg: TrainConfig) -> dict | None:
    from openclaw_ref.bench import cost_probe_rank

    if tcfg.sync.name == "local":
        return {"collectives": 0, "wire_bytes": 0, "host_syncs": 0}
    probe = pools.get(tcfg.world_size).run(cost_probe_rank, tcfg)[0]
    return None if not probe or "unavailable" in probe else probe


def section_faults(cfg: CompareConfig, pools: PoolSet, progress: Progress) -> dict:
    """The fault × strategy matrix (2 ranks) and per-rank bucket layouts of every strategy."""
    from openclaw_ref.conform import (
        FAULTS, ConformSettings, MatrixRunner, MatrixSettings, check_bucket_alignment,
        matrix_strategies,
    )

    settings = MatrixSettings()
    runner = MatrixRunner(settings, get_pool=pools.get)
    cases = []
    try:
        for strategy in matrix_strategies():
            for fault in FAULTS:
                outcome = runner.run_case(strategy, fault)
                cases.append({**outcome.to_json(), "fault_name": fault,
                              "cell": outcome.summary()})
                progress.tick(f"fault {fault} × {strategy}")
    finally:
        runner.close()
    alignment = []
    w = max(cfg.world_sizes)
    for strategy in matrix_strategies():
        sync = dataclasses.replace(settings.sync_config(strategy), bucket_cap_mb=cfg.bucket_cap_mb)
        s = ConformSettings(sync=sync)
        if w >= 2:
            result = pools.get(w).run(check_bucket_alignment, s)[0]
            alignment.append({"strategy": strategy, "world_size": w, "aligned": result.passed,
                              "steps": s.steps, "buckets": result.figures.get("buckets"),
                              "detail": result.detail})
        progress.tick(f"bucket alignment {strategy}")
    strategies = list(dict.fromkeys(c["strategy"] for c in cases))
    faults = list(dict.fromkeys(c["fault"] for c in cases))
    cell = {(c["fault"], c["strategy"]): c["cell"] for c in cases}
    return {
        "settings": dataclasses.asdict(settings),
        "cases": cases,
        "bucket_alignment": alignment,
        "tables": [
            {"caption": f"Each cell: a {settings.steps}-step run of the tiny preset on "
                        f"{settings.world_size} gloo ranks with the fault injected on the last "
                        f"rank at step {settings.fault_step}; hardened/bucketed use an fp16 wire "
                        f"at 2^12, replica check every {settings.replica_check_every} steps, "
                        f"{settings.watchdog_s:.0f} s watchdog. Outcome: detected (with the "
                        "attribution it gave) / silent-corruption (replicas diverge or the result "
                        "differs from the fault-free run) / hang-timeout / crash / no-effect.",
             "headers": ["fault"] + strategies,
             "rows": [[f] + [cell.get((f, st), "") for st in strategies] for f in faults]},
            {"caption": f"Bucket layouts recorded on every rank ({w} ranks) at every step of a "
                        f"6-step run with a {cfg.bucket_cap_mb} MB bucket cap (stock DDP via a "
                        "recording comm hook): the seed's M3.",
             "headers": ["strategy", "ranks", "identical on all ranks", "buckets", "detail"],
             "rows": [[a["strategy"], a["world_size"], "yes" if a["aligned"] else "NO",
                       a["buckets"], a["detail"]] for a in alignment]},
        ],
    }


OVERFLOW_WORKLOADS = {"real": 0.0, "harsh": 2.0}  # extra spread: each element × 10^U(-d, d)


def section_overflow(cfg: CompareConfig, pools: PoolSet, progress: Progress) -> dict:
    """FP16 overflow on high-dynamic-range gradients: stock fp16 hook vs one shared scale."""
    from openclaw_ref.conform import ConformSettings, check_overflow_rate

    w = 2 if 2 in cfg.world_sizes else max(cfg.world_sizes)
    variants = {"ddp-fp16": SyncConfig(name="ddp-fp16"),
                "hardened-fp16": SyncConfig(name="hardened", wire="fp16", scale="4096"),
                "hardened-fp16-auto": SyncConfig(name="hardened", wire="fp16", scale="auto")}
    rates, vs_scale = [], []
    for workload, spread in OVERFLOW_WORKLOADS.items():
        for label, sync in variants.items():
            s = ConformSettings(sync=sync, hdr_spread_decades=spread, steps=8)
            fig = pools.get(w).run(check_overflow_rate, s, None)[0].figures
            rates.append({"strategy": label, "workload": workload, "world_size": w, **fig})
            progress.tick(f"overflow {label} {workload}")
    for exp in (4, 8, 12, 16):
        s = ConformSettings(sync=SyncConfig(name="hardened", wire="fp16", scale=str(2 ** exp)),
                            hdr_spread_decades=OVERFLOW_WORKLOADS["harsh"], steps=8)
        fig = pools.get(w).run(check_overflow_rate, s, None)[0].figures
        vs_scale.append({"strategy": "hardened fp16 (harsh workload)", "scale_exp": exp,
                         "overflow_rate": fig["overflow_rate"]})
        progress.tick(f"overflow scale 2^{exp}")
    return {
        "rates": rates, "vs_scale": vs_scale,
        "tables": [{
            "caption": f"Overflowed (inf/NaN) gradient elements after the sync, {w} ranks, 8 "
                       "batches with the weights held fixed. Workload 'real': the model's own "
                       "gradients (max/min nonzero |g| per step shown); 'harsh': each element "
                       "also × 10^U(-2, 2). The seed's F3 figure is 0.017%.",
            "headers": ["strategy", "workload", "overflow (elements)", "overflowed / elements",
                        "skipped steps", "min max/min |g|"],
            "rows": [[r["strategy"], r["workload"], f"{100 * r['overflow_rate']:.4f}%",
                      f"{r['overflow_elements']} / {r['elements']}", r["skipped_steps"],
                      f"{r['min_dynamic_range']:.2e}"] for r in rates]}],
    }


def section_precision(cfg: CompareConfig, pools: PoolSet, progress: Progress) -> dict:
    """Seed 004's matrix: 1 rank fp32, 1 rank AMP, N ranks DDP+AMP (bf16 autocast on CPU)."""
    from openclaw_ref.bench import BenchSettings, run_seed004_case

    n = max(cfg.world_sizes)
    settings = BenchSettings(preset=cfg.preset, steps=max(12, cfg.steps // 2),
                             global_batch=cfg.global_batch, seed=cfg.seed, max_world=n)
    rows = []
    for precision, w in (("fp32", 1), ("amp", 1), ("fp32", n), ("amp", n)):
        r = run_seed004_case(precision, w, resolve_backend(cfg.backend, w), settings,
                             pool=pools.get(w))
        label = (f"{w} rank{'s' if w > 1 else ''} {'DDP+' if w > 1 else ''}"
                 f"{'AMP (' + r['amp_dtype'] + ')' if r['amp_dtype'] else 'fp32'}")
        rows.append({"label": label, "world_size": w, "peak_mib": r["peak_memory_mb"],
                     **r})
        progress.tick(f"precision {label}")
    return {
        "rows_data": rows,
        "tables": [{
            "caption": f"Seed 004's table on this machine: the {cfg.preset} preset, global batch "
                       f"{cfg.global_batch} (so per-rank batch shrinks with ranks), median step "
                       "of the slowest rank, peak memory per rank (max RSS on CPU).",
            "headers": ["configuration", "s/iter", "peak MiB/rank", "final loss"],
            "rows": [[r["label"], f"{r['s_per_iter']:.4f}", f"{r['peak_mib']:.0f}",
                      f"{r['final_loss']:.4f}"] for r in rows]}],
    }


def section_raw_allreduce(cfg: CompareConfig, pools: PoolSet, progress: Progress) -> dict:
    """A flat allreduce of the gradient bytes (fp32 and fp16): the limit any sync approaches."""
    from openclaw_ref.bench import algbw_gbps, busbw_gbps, raw_allreduce_rank
    from openclaw_ref.model import build_model

    numel = sum(p.numel() for p in build_model(preset_cfg(cfg)).parameters())
    rows = []
    for w in cfg.world_sizes:
        if w < 2:
            progress.tick("raw allreduce ×1 (nothing to reduce)")
            continue
        for wire, width in (("fp32", 4), ("fp16", 2)):
            times = pools.get(w).run(raw_allreduce_rank, numel, wire, 20)[0]
            ms = statistics.median(times)
            alg = algbw_gbps(numel * width, ms / 1e3)
            rows.append({"world_size": w, "wire": wire, "bytes": numel * width, "median_ms": ms,
                         "algbw_gbps": alg, "busbw_gbps": busbw_gbps(alg, w)})
        progress.tick(f"raw allreduce ×{w}")
    return {
        "rows_data": rows,
        "tables": [{
            "caption": f"One flat allreduce of all {numel} gradient elements of the "
                       f"{cfg.preset} preset, median of 20 (slowest rank, after a barrier). "
                       "busbw = algbw × 2(n−1)/n (nccl-tests).",
            "headers": ["ranks", "wire", "bytes", "median ms", "algbw GB/s", "busbw GB/s"],
            "rows": [[r["world_size"], r["wire"], r["bytes"], f"{r['median_ms']:.3f}",
                      f"{r['algbw_gbps']:.3f}", f"{r['busbw_gbps']:.3f}"] for r in rows]}],
    }


def section_ablations(cfg: CompareConfig, pools: PoolSet, progress: Progress) -> dict:
    """Two controls the seed never ran: (1) is the skew caused by the sparse path? the same
    hardened runs with the gating unit's masking off (sparsity 0); (2) the seed's P2 barrier
    (std of bucket-ready times > 1.5 ms → barrier before the next backward), on vs off, with
    the seed's Δt ∈ [0.3, 5.7] ms per-rank jitter injected."""
    from openclaw_ref.p2bench import measure_skew_barrier

    w = max(cfg.world_sizes)
    sparsity = {}
    for label, rng in (("sparse (seed range)", None), ("masking off (s = 0)", (0.0, 0.0))):
        skews: list[float] = []
        for _ in range(cfg.repeats):
            tcfg = TrainConfig(preset=cfg.preset, world_size=w, steps=cfg.steps,
                               global_batch=cfg.global_batch, seed=cfg.seed, eval_every=0,
                               progress=False, backend=cfg.backend, sparsity_range=rng,
                               sync=SyncConfig(name="hardened", bucket_cap_mb=cfg.bucket_cap_mb))
            record = pools.get(w).run(run_and_return_params, tcfg)[0]["record"]
            skews += slim_run(record)["skew_ms"]
        sparsity[label] = {"world_size": w, "bucket_steps": len(skews),
                           "share_over_3ms": sum(x > 3.0 for x in skews) / max(1, len(skews)),
                           "skew_p50_ms": percentile(skews, 50) if skews else None,
                           "skew_p99_ms": percentile(skews, 99) if skews else None}
        progress.tick(f"ablation {label}")
    pw = 2 if 2 in cfg.world_sizes else w
    barrier = measure_skew_barrier(world_size=pw, steps=cfg.steps, repeats=cfg.repeats,
                                   preset=cfg.preset, pool=pools.get(pw))
    progress.tick("P2 barrier on/off")
    barrier_rows = []
    for arm, runs in barrier.items():
        barrier_rows.append({
            "arm": arm, "world_size": pw,
            **{k: statistics.median(r[k] for r in runs)
               for k in ("median_step_ms", "median_ready_std_ms", "p90_ready_std_ms",
                         "median_skew_ms")},
            "barriers": sum(r["barriers"] for r in runs), "steps": sum(r["steps"] for r in runs)})
    return {
        "sparsity": sparsity, "skew_barrier": barrier_rows,
        "tables": [
            {"caption": f"Per-bucket skew of hardened fp32 on {w} ranks, {cfg.repeats} × "
                        f"{cfg.steps} steps, with the sparse gating unit masking per the seed's "
                        "schedule vs masking off: is the skew caused by the sparse path (C4)?",
             "headers": ["gating", "bucket-steps", "share > 3 ms", "skew p50 ms", "skew p99 ms"],
             "rows": [[k, v["bucket_steps"], f"{100 * v['share_over_3ms']:.1f}%",
                       f"{v['skew_p50_ms']:.2f}", f"{v['skew_p99_ms']:.2f}"]
                      for k, v in sparsity.items()]},
            {"caption": f"The seed's P2 policy on {pw} ranks (hardened fp32, tiny preset, "
                        f"{cfg.repeats} × {cfg.steps} steps per arm, arms interleaved, each rank "
                        "sleeping a seeded Δt ∈ [0.3, 5.7] ms before every backward): medians "
                        "over repeats.",
             "headers": ["barrier", "step ms", "std of ready times ms (median)",
                         "std of ready times ms (p90)", "max bucket skew ms", "barriers / steps"],
             "rows": [[r["arm"], f"{r['median_step_ms']:.1f}", f"{r['median_ready_std_ms']:.2f}",
                       f"{r['p90_ready_std_ms']:.2f}", f"{r['median_skew_ms']:.2f}",
                       f"{r['barriers']} / {r['steps']}"] for r in barrier_rows]},
        ],
    }


def preset_cfg(cfg: CompareConfig):
    from openclaw_ref.model import preset

    return preset(cfg.preset, seed=cfg.seed)


SECTION_RUNNERS: dict[str, Callable[[CompareConfig, PoolSet, Progress], dict]] = {
    "curves": section_curves,
    "faults": section_faults,
    "overflow": section_overflow,
    "precision": section_precision,
    "raw_allreduce": section_raw_allreduce,
    "ablations": section_ablations,
}

SECTION_JOBS: dict[str, Callable[[CompareConfig, tuple], int]] = {
    "strategies": lambda c, v: 1 + c.repeats * len(c.world_sizes) * len(v),
    "curves": lambda c, v: 2,
    "faults": lambda c, v: 4 * 9 + 4,
    "overflow": lambda c, v: 2 * 3 + 4,
    "precision": lambda c, v: 4,
    "raw_allreduce": lambda c, v: len(c.world_sizes),
    "ablations": lambda c, v: 3,
}
