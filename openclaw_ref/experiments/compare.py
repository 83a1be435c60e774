"""``openclaw-bench compare``: the main comparison, run at this machine's scale.

It trains the openclaw model under every sync strategy on every world size (interleaved and
repeated, because sync variants differ by less than the timing noise here), runs the fault
matrix (with the seed's F5 hook as written), the precision matrix of seed 004, the overflow
sweep and the rank-dependent pre-scale (M4) up to 8 ranks, a short Lightning run and int8
quantization of a trained model (seed 004), and stores everything as one compact raw JSON
with its environment. This module is the driver: the run loop over ``registry.SECTIONS``
(each section's runner lives in ``experiments/sections/``; the config and the progress bar
they are handed, in ``settings.py``) and the write. Rendering (tables, plots, the claims
ledger) is ``reporting``'s job and reads only that JSON, so ``openclaw-bench report``
reproduces every file byte for byte.

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
import sys
import time
from pathlib import Path
from typing import Any

from openclaw_ref.core.environment import environment
from openclaw_ref.core.launch import on_cuda, resolve_backend
from openclaw_ref.core.pools import PoolCache
from openclaw_ref.experiments.checkpoint import Checkpoints, Finished, discard, fingerprint
from openclaw_ref.experiments.merge import check_mergeable, existing_record, is_partial, merge
from openclaw_ref.experiments.registry import SECTIONS, expected_seconds
from openclaw_ref.experiments.sections.strategies import Variant, variants_of
from openclaw_ref.experiments.settings import CompareConfig, Progress
from openclaw_ref.reporting.record import RAW_NAME, SCHEMA_VERSION


def placements(backend: str, world_sizes: tuple[int, ...]) -> list[dict]:
    """Per world size the process group's backend and where the tensors live: with ``nccl`` and
    fewer GPUs than ranks, gloo with CUDA tensors (``launch.resolve_backend``)."""
    return [{"world_size": w, "backend": resolve_backend(backend, w),
             "device": "cuda" if on_cuda(backend, w) else "cpu"}
            for w in sorted(set(world_sizes) | {1})]


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
