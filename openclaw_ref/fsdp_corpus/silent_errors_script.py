"""Published FSDP2 mistakes, written the way a user writes them, on a plain 5-layer MLP with
``fully_shard`` per layer and on the root.

    torchrun --standalone --nproc-per-node 2 -m openclaw_ref.fsdp_corpus.silent_errors_script \
        --pattern lr-one-rank --column stock

``--pattern`` takes one name or several, comma-separated, run in order in one job; the job
stops after the first pattern in which a rank failed (its process group is then broken). For
each pattern the script first runs the same script without the mistake (the reference), then
with it. Every rank writes its own result file per pattern (``outcome.RankResult``); rank 0
prints one JSON line per pattern: the ``outcome.Outcome`` with the column, world size and mesh.
A rank killed by a signal writes nothing, and torchrun then ends rank 0 too:
``launch.run_job`` classifies what was left. Every wait has a deadline: the process group's
timeout (``--timeout-s``), a watchdog per run, and the wait for the other ranks' files.

Columns: ``stock`` is FSDP2 as shipped; ``hardened`` applies ``harden()`` (``wrap``) to the model
right after ``fully_shard``.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import hashlib
import json
import os
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from openclaw_ref.fsdp_corpus.outcome import (
    RankResult,
    Status,
    classify,
    default_out_dir,
    process_group_intact,
    step_path,
    wait_for_results,
    write_result,
)
from openclaw_ref.fsdp_corpus.patterns import CLEAN, FAULT_STEP, Column, Mesh, acts_on, pattern
from openclaw_ref.sync.base import SyncConfig
from openclaw_ref.sync.errors import BadInput, ConsistencyError
from openclaw_ref.sync.hardening import harden

STEPS = 6
LR = 1e-2
WIDTH = 32
BATCH = 16  # per rank
MAX_NORM = 0.05  # below every step's global and per-rank norm here (smallest seen 0.13): clips
CHECKPOINT_DELTA = 1e-2  # the "checkpoint" is the initial model plus this, element-wise
LR_FACTOR = 2.0  # the faulty rank's learning rate ÷ the others'


class MLP(nn.Module):
    """Three sharded hidden layers; ``aux`` and ``out`` belong to the root's group."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(8, WIDTH)
        self.h1 = nn.Linear(WIDTH, WIDTH)
        self.h2 = nn.Linear(WIDTH, WIDTH)
        self.aux = nn.Linear(WIDTH, WIDTH)
        self.out = nn.Linear(WIDTH, 1)
        self.use_aux = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, 8) → (B, 1)
        x = F.relu(self.inp(x))
        x = F.relu(self.h1(x))
        x = F.relu(self.h2(x))
        if self.use_aux:
            x = x + self.aux(x)
        return self.out(x)


def batch(step: int, rank: int, world_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank ``rank``'s shard of global batch ``step`` (seeded: every run sees the same data)."""
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(BATCH * world_size, 8, generator=g)
    y = x.sum(dim=1, keepdim=True).sin()
    return x[rank * BATCH:(rank + 1) * BATCH], y[rank * BATCH:(rank + 1) * BATCH]


def device_mesh(kind: Mesh) -> DeviceMesh:
    world = dist.get_world_size()
    if kind is Mesh.HSDP:
        return init_device_mesh("cpu", (world // 2, 2), mesh_dim_names=("replicate", "shard"))
    return init_device_mesh("cpu", (world,), mesh_dim_names=("shard",))


def shard(model: MLP, mesh: DeviceMesh, mp: MixedPrecisionPolicy) -> None:
    for layer in (model.inp, model.h1, model.h2):
        fully_shard(layer, mesh=mesh, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp)


@dataclasses.dataclass
class ScriptRank:
    """What ``harden()`` may know of this rank (``sync.base.RankInfo``): the default store, and
    how its watchdog's thread ends the process — ``fatal`` writes this rank's result first."""

    fatal: Callable[[BaseException], None]
    watchdog_s: float | None = None  # another deadline for the watchdog (None: harden's)
    backend: str = "gloo"
    device: torch.device = dataclasses.field(default_factory=lambda: torch.device("cpu"))

    def __post_init__(self) -> None:
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.store = dist.distributed_c10d._get_default_store()

    def report_fatal(self, exc: BaseException) -> None:
        self.fatal(exc)


def wrap(model: nn.Module, column: Column, rank: ScriptRank | None = None) -> Any:
    """The column's hardening of the sharded model, and what to close afterwards (stock: none).
    ``hardened``: ``harden(model)`` with its defaults, the optimizer found at its first step;
    with ``rank``, its watchdog ends the process through it (and with its deadline)."""
    if column is not Column.HARDENED:
        return None
    if rank is None:
        return harden(model)
    cfg = None if rank.watchdog_s is None else SyncConfig(watchdog_s=rank.watchdog_s)
    return harden(model, cfg, rank)


def full_parameters(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter's full tensor (gathered over the shard dimension only: under HSDP each
    replica gathers its own copy, so diverged replicas give different tensors)."""
    return {name: p.full_tensor().detach().clone()
            for name, p in sorted(model.named_parameters())}


def digest(params: dict[str, torch.Tensor]) -> str:
    h = hashlib.sha256()
    for name, t in params.items():
        h.update(name.encode())
        h.update(t.double().numpy().tobytes())
    return h.hexdigest()[:16]


def max_abs_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return max(float((a[k].double() - b[k].double()).abs().max()) for k in a)


class Progress:
    """The step a rank is in, kept in a small file too: a rank killed by a signal cannot say
    where it was, the file can (written without fsync: a torn read counts as unknown)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.step = 0

    def enter(self, step: int) -> None:
        self.step = step
        self.path.write_text(str(step))


def clip_local_norm(model: nn.Module, max_norm: float = MAX_NORM) -> None:
    """The mistake: each rank clips its shards by the norm of its shards alone (the local
    shards are views of the gradients: scaling them scales this rank's part of each one)."""
    local = [p.grad.to_local() for p in model.parameters() if p.grad is not None]
    coef = (max_norm / (torch.nn.utils.get_total_norm(local) + 1e-6)).clamp(max=1.0)
    torch._foreach_mul_(local, coef)


def train(name: str, faulty: bool, column: Column, mesh_kind: Mesh, progress: Progress,
          steps: int = STEPS, rank_info: ScriptRank | None = None) -> dict[str, torch.Tensor]:
    """The user's script (process group up): the full parameters after ``steps`` steps.
    With ``faulty`` False it is the same script with the mistake corrected."""
    rank, world = dist.get_rank(), dist.get_world_size()
    mine = name != CLEAN and faulty and acts_on(pattern(name), rank, world)
    torch.manual_seed(0)
    model = MLP()
    opt = torch.optim.AdamW(model.parameters(), lr=LR) if mine and \
        name == "optimizer-before-shard" else None
    low = mine and name == "mixed-precision-differs"
    shard(model, device_mesh(mesh_kind),
          MixedPrecisionPolicy(param_dtype=torch.bfloat16) if low else MixedPrecisionPolicy())
    extra = wrap(model, column, rank_info)
    try:
        if name == "load-one-rank" and (mine or not faulty):
            model.load_state_dict({k: v.detach() + CHECKPOINT_DELTA
                                   for k, v in model.state_dict().items()})
        if opt is None:
            opt = torch.optim.AdamW(model.parameters(), lr=LR)
        for step in range(steps):
            progress.enter(step)
            _one_step(model, opt, name, mine and step >= FAULT_STEP, step == FAULT_STEP,
                      batch(step, rank, world))
        progress.enter(steps)
        return full_parameters(model)
    finally:
        if extra is not None:
            extra.close()


def _one_step(model: Any, opt: torch.optim.Optimizer, name: str, faulty: bool,
              first_faulty: bool, data: tuple[torch.Tensor, torch.Tensor]) -> None:
    x, y = data
    model.use_aux = not (name == "unused-param-one-rank" and first_faulty and faulty)
    if name == "no-sync-one-rank" and first_faulty and faulty:
        model.set_requires_gradient_sync(False)  # this rank thinks it is mid-accumulation
    F.mse_loss(model(x), y).backward()
    if name == "extra-backward-one-rank" and first_faulty and faulty:
        F.mse_loss(model(x), y).backward()  # one more micro-batch on this rank only
    model.set_requires_gradient_sync(True)
    model.use_aux = True
    if name == "clip-local-norm":
        if faulty:
            clip_local_norm(model)
        else:
            torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)
    for group in opt.param_groups:
        group["lr"] = LR * (LR_FACTOR if name == "lr-one-rank" and faulty else 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)


def _result_of(rank: int, name: str, step: int, exc: BaseException) -> RankResult:
    """This rank's result when ``exc`` stopped its run."""
    if isinstance(exc, ConsistencyError):
        detection = {"kind": type(exc).__name__, "step": exc.step, "ranks": exc.ranks,
                     "params": exc.params, "detail": str(exc)[:300],
                     # named after gloo failed FSDP2's collective: the group is broken
                     "collective_failed": isinstance(exc.__cause__, RuntimeError)}
        return RankResult(rank, name, Status.DETECTED, step, detection=detection)
    first = (str(exc).strip().splitlines() or [""])[0]
    return RankResult(rank, name, Status.ERROR, step,
                      error=f"{type(exc).__name__}: {first[:400]}")


def _fatal(out_dir: Path, name: str, progress: Progress, exc: BaseException) -> None:
    """The watchdog ends this rank from its thread (the main one is inside a collective that
    cannot complete): its result first, then the process, with the error's exit code."""
    try:
        write_result(out_dir, _result_of(dist.get_rank(), name, progress.step, exc))
        print(f"openclaw watchdog: {exc}", file=sys.stderr, flush=True)
    finally:
        os._exit(getattr(exc, "exit_code", 1))


Train = Callable[[Progress, ScriptRank], dict[str, torch.Tensor]]


def run_once(name: str, train_fn: Train, out_dir: Path, watchdog_s: float,
             on_watchdog: Callable[[int], None],
             reference: dict[str, torch.Tensor] | None = None,
             guard_watchdog_s: float | None = None,
             ) -> tuple[RankResult, dict[str, torch.Tensor] | None]:
    """One training run (``train_fn``: the user's script, its full parameters at the end) as
    this rank saw it, and its full parameters; never raises (a failure is the result). With
    ``reference``, the result says how far it ended from it."""
    rank = dist.get_rank()
    progress = Progress(step_path(out_dir, name, rank))
    timer = threading.Timer(watchdog_s, lambda: on_watchdog(progress.step))
    timer.daemon = True
    timer.start()
    try:
        params = train_fn(progress, ScriptRank(
            lambda exc: _fatal(out_dir, name, progress, exc), guard_watchdog_s))
        diff = None if reference is None else max_abs_diff(params, reference)
        return RankResult(rank, name, Status.FINISHED, progress.step, digest=digest(params),
                          max_abs_diff=diff), params
    except Exception as exc:  # noqa: BLE001 - what the user's script would have died of
        return _result_of(rank, name, progress.step, exc), None
    finally:
        timer.cancel()


def reference_of(name: str) -> str:
    """The pattern whose corrected run is this pattern's reference: its own where correcting
    the mistake still changes the script (clip by the global norm, load on every rank),
    otherwise the clean script, run once per job."""
    return name if name in ("clip-local-norm", "load-one-rank") else CLEAN


References = dict[str, tuple[RankResult, dict[str, torch.Tensor] | None]]


def harness_watchdog_s(timeout_s: float, column: Column, guard_s: float | None) -> float:
    """How long one run may take before this script calls it hung: past gloo's timeout (twice,
    and 30 s), and under harden() past its own watchdog's deadline and the grace its peers then
    have (half of it), and 30 s — a harness that gave up first would report harden()'s hang
    detection as a hang."""
    own = 2 * timeout_s + 30
    if column is not Column.HARDENED:
        return own
    guard = SyncConfig().watchdog_s if guard_s is None else guard_s
    return max(own, 1.5 * guard + 30)


def run_pattern(name: str, args: argparse.Namespace, out_dir: Path,
                references: References) -> bool:
    """The run without the mistake (the reference, cached in ``references``), then the run
    with it; this rank's result written, and on rank 0 the outcome printed once every rank has
    written. True when every rank left the run normally (finished, or a check stopped it)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    column, mesh_kind = Column(args.column), Mesh(args.mesh)
    watchdog_s = harness_watchdog_s(args.timeout_s, column, args.watchdog_s)

    def on_watchdog(step: int) -> None:
        write_result(out_dir, RankResult(rank, name, Status.WATCHDOG, step,
                                         error=f"still running after {watchdog_s:.0f} s"))
        os._exit(0)

    key = reference_of(name)
    if key not in references:
        references[key] = run_once(
            key, lambda progress, info: train(key, False, column, mesh_kind, progress,
                                              rank_info=info),
            out_dir, watchdog_s, on_watchdog, guard_watchdog_s=args.watchdog_s)
    ref, ref_params = references[key]
    if ref.status is Status.FINISHED:
        result, _ = run_once(
            name, lambda progress, info: train(name, True, column, mesh_kind, progress,
                                               rank_info=info),
            out_dir, watchdog_s, on_watchdog, ref_params, guard_watchdog_s=args.watchdog_s)
    else:
        result = dataclasses.replace(ref, pattern=name,
                                     error=f"the run without the mistake failed: {ref.error}")
    write_result(out_dir, result)
    results = wait_for_results(out_dir, name, world, args.timeout_s + 20)
    if rank == 0:
        outcome = classify(name, results, ref.digest)
        print(json.dumps({"column": column.value, "world_size": world, "mesh": mesh_kind.value,
                          **outcome.to_json()}), flush=True)
    return process_group_intact(results)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pattern", default=CLEAN,
                    help="a pattern name, or several comma-separated (default: none)")
    ap.add_argument("--column", choices=[c.value for c in Column], default=Column.STOCK.value)
    ap.add_argument("--mesh", choices=[m.value for m in Mesh], default=Mesh.FSDP.value)
    ap.add_argument("--timeout-s", type=float, default=30.0,
                    help="the process group's timeout (default 30)")
    ap.add_argument("--watchdog-s", type=float, default=None,
                    help="the hardened column's watchdog deadline (default: harden()'s)")
    ap.add_argument("--out-dir", type=Path, default=None,
                    help="where each rank writes its result files (default: per torchrun job)")
    args = ap.parse_args(argv)
    args.patterns = [p.strip() for p in args.pattern.split(",") if p.strip()]
    try:
        for name in args.patterns:
            if name != CLEAN:
                pattern(name)
        if args.timeout_s <= 0:
            raise BadInput(f"--timeout-s must be positive, got {args.timeout_s}")
        if args.mesh == Mesh.HSDP and int(os.environ.get("WORLD_SIZE", "2")) % 2:
            raise BadInput("--mesh hsdp needs an even world size")
    except BadInput as exc:
        ap.error(str(exc))
    return args


def run_in_order(names: list[str], timeout_s: float, out_dir: Path | None,
                 run_one: Callable[[str, Path], bool]) -> None:
    """This rank's whole job: the process group up (gloo, ``timeout_s``), ``run_one(name,
    out_dir)`` per name in order until one returns False (a rank failed: the process group is
    broken, and destroying it can hang), then the process ended without the interpreter's slow
    teardown — every result is on disk and printed by then. The pid file is the launcher's."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=timeout_s))
    out_dir = out_dir or default_out_dir()
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"rank{dist.get_rank()}.pid").write_text(str(os.getpid()))
    for name in names:
        if not run_one(name, out_dir):
            break
    else:
        dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    references: References = {}
    run_in_order(args.patterns, args.timeout_s, args.out_dir,
                 lambda name, out_dir: run_pattern(name, args, out_dir, references))


if __name__ == "__main__":
    main()
