"""``openclaw-bench compare``: the main comparison, run at this machine's scale.

It trains the openclaw model under every sync strategy on every world size (interleaved and
repeated, because sync variants differ by less than the timing noise here), runs the fault
matrix (with the seed's F5 hook as written), the precision matrix of seed 004, the overflow
sweep and the rank-dependent pre-scale (M4) up to 8 ranks, a short Lightning run and int8
quantization of a trained model (seed 004), and stores everything as one compact raw JSON
with its environment. This module is the driver: the config, the progress bar, the run loop
over ``registry.SECTIONS`` (each section's runner lives in ``experiments/sections/``) and the
write. Rendering (tables, plots, the claims ledger) is ``reporting``'s job and reads only that
JSON, so ``openclaw-bench report`` reproduces every file byte for byte.

No published file under ``results/<machine>/`` changes until every section has finished: an
interrupted run leaves the previous results intact and says which sections it did not finish.
A partial run (``--sections``) is merged into the record already there, never written over it:
only the sections it ran are replaced, each with its own environment (``merge.py``).
Each finished section is checkpointed in ``results/<machine>/.partial/`` (``checkpoint.py``);
``resume=True`` (``compare --resume``) reuses those and runs only the rest, and the write
removes them.

``quick_config()`` (``compare --quick``) is the same comparison at a newcomer's scale: every
section on a representative subset (each section names its own: ``QUICK_*``) at the smallest
settings that still fill every table and plot, a few minutes on 2 CPU cores. Its figures are
not results: it never writes under the published ``results/`` directory (``validate``), and
its record says ``quick``, which every file rendered from it states.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from openclaw_ref.core.environment import environment
from openclaw_ref.core.jsonio import check_output_dir
from openclaw_ref.core.launch import on_cuda, resolve_backend
from openclaw_ref.core.model import PRESETS
from openclaw_ref.core.pools import PoolCache
from openclaw_ref.core.progress import progress_bar
from openclaw_ref.experiments.checkpoint import Checkpoints, Finished, discard, fingerprint
from openclaw_ref.experiments.merge import check_mergeable, existing_record, is_partial, merge
from openclaw_ref.experiments.registry import SECTIONS, expected_seconds
from openclaw_ref.experiments.sections.strategies import Variant, variants_of
from openclaw_ref.reporting.record import RAW_NAME, SCHEMA_VERSION
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


def placements(backend: str, world_sizes: tuple[int, ...]) -> list[dict]:
    """Per world size the process group's backend and where the tensors live: with ``nccl`` and
    fewer GPUs than ranks, gloo with CUDA tensors (``launch.resolve_backend``)."""
    return [{"world_size": w, "backend": resolve_backend(backend, w),
             "device": "cuda" if on_cuda(backend, w) else "cpu"}
            for w in sorted(set(world_sizes) | {1})]


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


class CompareInterrupted(Exception):
    """Ctrl-C during a comparison: nothing was written; says what had and had not finished."""

    def __init__(self, done: list[str], pending: list[str], current: str) -> None:
        self.done, self.pending, self.current = done, pending, current
        super().__init__(f"interrupted during {current!r}; finished: {done or 'nothing'}; "
                         f"not finished: {pending}")


# The seed's F4 settings as written (its NCCL_BUFFSIZE is blank in the text; 2 MB is meant).
SEED_F4_ENV = {"NCCL_ASYNC_ERROR_HANDLING": "1", "NCCL_RING_ALGO": "1", "NCCL_MIN_NRINGS": "4",
               "NCCL_BUFFSIZE": "2097152"}


def seed_env_lint() -> dict:
    """The doctor's findings on the seed's F4 settings, recorded so the ledger reads them."""
    from openclaw_ref.ops.doctor import lint_environment

    return {"env": dict(SEED_F4_ENV),
            "findings": [dataclasses.asdict(f) for f in lint_environment(SEED_F4_ENV)]}


def _environment(cfg: CompareConfig) -> dict[str, Any]:
    return environment(resolve_backend(cfg.backend, max(cfg.world_sizes)), max(cfg.world_sizes))


def _new_record(cfg: CompareConfig, env: dict[str, Any]) -> dict[str, Any]:
    return {
        "schema_version": SCHEMA_VERSION,
        "doctor": seed_env_lint(),
        "meta": {
            "environment": env,
            "compare_config": dataclasses.asdict(cfg),
            "placements": placements(cfg.backend, cfg.world_sizes),
            "sections_run": [], "sections_skipped": {},
        },
    }


def _announce(jobs: dict[str, int], finished: dict[str, Finished], quick: bool) -> None:
    """Before the first job: what was resumed, how many jobs are left and how long they took on
    the reference machine (for a quick run, whose jobs are shorter, an upper bound)."""
    if finished:
        sys.stderr.write(f"compare: resuming; finished before: {', '.join(finished)}\n")
    minutes = expected_seconds(jobs) / 60
    expected = (f"a quick run: less than the ~{minutes:.0f} min these jobs take at the full "
                "run's settings on 2 idle CPU cores with gloo" if quick else
                f"expected ~{minutes:.0f} min (as on 2 CPU cores with gloo at the default "
                "settings)")
    sys.stderr.write(f"compare: {sum(jobs.values())} jobs in {len(jobs)} sections, "
                     f"{expected}\n")


def run_compare(cfg: CompareConfig, variants: tuple[Variant, ...] | None = None, *,
                resume: bool = False) -> dict:
    """Run every requested section (with ``resume``, only those not checkpointed by an earlier
    run of the same configuration); returns the raw document (not yet written). A partial run
    that could not merge into the record of its directory is refused first (``merge``)."""
    cfg.validate()
    env = _environment(cfg)
    check_mergeable(cfg, env)
    variants = variants or variants_of(cfg)
    checkpoints = Checkpoints(cfg.out_dir(), fingerprint(cfg, variants))
    if not resume:
        discard(cfg.out_dir())
    finished = {k: v for k, v in checkpoints.load().items() if k in cfg.sections}
    jobs = {name: SECTIONS[name].jobs(cfg, variants) for name in cfg.sections
            if name not in finished}
    _announce(jobs, finished, cfg.quick)
    progress = Progress(sum(jobs.values()))
    raw = _new_record(cfg, env)
    done = raw["meta"]["sections_run"]
    pools = PoolCache(backend=cfg.backend, timeout_s=900, pg_timeout_s=120)
    started = time.monotonic()
    current = "starting rank pools"
    try:
        for w in sorted(set(cfg.world_sizes) | {1}):
            pools.get(w)
        for name in cfg.sections:
            current = name
            if name in finished:
                raw[name], seconds = finished[name]
            else:
                progress.section(name)
                t0 = time.monotonic()
                raw[name] = SECTIONS[name].run(cfg, pools, progress, variants)
                seconds = round(time.monotonic() - t0, 1)
                checkpoints.save(name, raw[name], seconds)
            done.append({"name": name, "seconds": seconds})
    except KeyboardInterrupt:
        finished_now = [s["name"] for s in done]
        raise CompareInterrupted(finished_now,
                                 [n for n in cfg.sections if n not in finished_now],
                                 current) from None
    finally:
        progress.close()
        pools.close()
    raw["meta"]["wall_s"] = round(time.monotonic() - started, 1)
    return raw


def write_results(raw: dict, out_dir: Path) -> list[Path]:
    """Store the raw document — a partial run's merged into the record already there
    (``merge``) — then render every derived file from what was stored (each write atomic);
    then drop the run's checkpoints."""
    from openclaw_ref.core.jsonio import write_json_atomic
    from openclaw_ref.reporting.render import render_all

    existing = (existing_record(out_dir) if is_partial(raw["meta"]["compare_config"]["sections"])
                else None)  # a run of every section replaces any record, readable or not
    if existing is not None:
        raw = merge(existing, raw)
    write_json_atomic(out_dir / RAW_NAME, raw, compact=True, float_digits=6)
    written = [out_dir / RAW_NAME] + render_all(out_dir)
    discard(out_dir)
    return written
