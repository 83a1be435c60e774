"""FSDP2 × tensor-parallel set-ups and published TP/SP mistakes, written the way a user writes
them (``model``), on a 2-D ``(dp, tp)`` mesh of 4 ranks or a 3-D ``(replicate, shard, tp)``
mesh of 8.

    torchrun --standalone --nproc-per-node 4 -m openclaw_ref.tp_corpus.script \\
        --case sequence-parallel,norms-left-out-of-sp --column stock

``--case`` takes one name or several, comma-separated, all on one mesh, run in order in one
job; the job stops after the first case in which a rank failed (its process group is then
broken). A mistake is judged against its healthy base case, run earlier in the same job when
listed. Every rank writes its result and its full parameters per case; rank 0 prints one JSON
line per case (``outcome.judge``). Every wait has a deadline: the process group's timeout, a
watchdog per run, the wait for the other ranks' files (``fsdp_corpus``'s harness).

Columns: ``stock`` is the script as written; ``hardened`` calls ``harden(model)`` with its
defaults right after the last ``fully_shard``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import warnings
from collections.abc import Iterator
from pathlib import Path

import torch
import torch.distributed as dist

from openclaw_ref.fsdp_corpus.outcome import (
    RankResult,
    Status,
    process_group_intact,
    wait_for_results,
    write_result,
)
from openclaw_ref.fsdp_corpus.patterns import Column
from openclaw_ref.fsdp_corpus.silent_errors_script import (
    Progress,
    ScriptRank,
    clip_local_norm,
    digest,
    harness_watchdog_s,
    run_in_order,
    run_once,
    wrap,
)
from openclaw_ref.sync.errors import BadInput
from openclaw_ref.tp_corpus.cases import FAULT_STEP, Case, Clip, Fault, MeshShape, acts_on, case
from openclaw_ref.tp_corpus.model import (
    batch,
    build,
    clip_per_mesh,
    clip_world_sum,
    data_rank,
    forward_backward,
)
from openclaw_ref.tp_corpus.outcome import judge, write_params

STEPS = 12
LR = 1e-2
LR_FACTOR = 2.0  # the faulty rank's learning rate ÷ the others'
WEIGHT_DELTA = 1e-2  # added to the faulty rank's copy of blocks.0.norm.weight
MAX_NORM = 0.05  # below every step's gradient norm here: the clipping acts on every step
COMPILE_S = 300.0  # more time a run with compiled blocks may take (inductor's first compile)
CLIPS = {Clip.PER_MESH: clip_per_mesh, Clip.LOCAL: clip_local_norm, Clip.WORLD_SUM: clip_world_sum}


def train(c: Case, column: Column, progress: Progress,
          rank_info: ScriptRank | None = None) -> dict[str, torch.Tensor]:
    """The user's script (process group up): the full parameters after ``STEPS`` steps."""
    rank, world = dist.get_rank(), dist.get_world_size()
    model, mesh = build(c.mesh, c.plan, c.compiled)
    guard = wrap(model, column, rank_info)
    try:
        mine = acts_on(c, rank)
        if c.fault is Fault.WEIGHT_ONE_RANK and mine:
            with torch.no_grad():
                model.blocks[0].norm.weight.to_local().add_(WEIGHT_DELTA)
        lr = LR * (LR_FACTOR if c.fault is Fault.LR_ONE_RANK and mine else 1.0)
        opt = torch.optim.AdamW(model.parameters(), lr=lr)
        index, size = (rank, world) if c.fault is Fault.LOADER_BY_GLOBAL_RANK \
            else data_rank(mesh)
        for step in range(STEPS):
            progress.enter(step)
            x, y = batch(step, index, size)
            forward_backward(model, x, y, c.plan)
            if c.fault is Fault.EXTRA_MICROBATCH and mine and step == FAULT_STEP:
                forward_backward(model, x, y, c.plan)  # one more micro-batch on this rank only
            if c.clip is not Clip.NONE:
                CLIPS[c.clip](model, MAX_NORM)
            opt.step()
            opt.zero_grad(set_to_none=True)
        progress.enter(STEPS)
        return {name: p.full_tensor().detach().clone()
                for name, p in sorted(model.named_parameters())}
    finally:
        if guard is not None:
            guard.close()


@contextlib.contextmanager
def printed_warnings() -> Iterator[list[str]]:
    """Every warning shown inside the block, as "Category: message", still shown as the
    user's filters would (the registry is fresh per block: each run shows its own)."""
    seen: list[str] = []
    with warnings.catch_warnings():
        show = warnings.showwarning

        def record(message, category, filename, lineno, file=None, line=None) -> None:
            seen.append(f"{category.__name__}: {message}"[:300])
            show(message, category, filename, lineno, file, line)

        warnings.showwarning = record
        yield seen


Finished = dict[str, dict[str, torch.Tensor]]  # this rank's full parameters per case run


def run_case(name: str, args: argparse.Namespace, out_dir: Path, finished: Finished) -> bool:
    """The case on this rank (against its base's parameters when the job ran it), its result
    and parameters written, on rank 0 the outcome printed once every rank has written. True
    when every rank left the run normally (finished, or a check stopped it)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    c, column = case(name), Column(args.column)
    watchdog_s = harness_watchdog_s(args.timeout_s, column, None) + COMPILE_S * c.compiled

    def on_watchdog(step: int) -> None:
        write_result(out_dir, RankResult(rank, name, Status.WATCHDOG, step,
                                         error=f"still running after {watchdog_s:.0f} s"))
        os._exit(0)

    base = finished.get(c.base) if c.base else None
    with printed_warnings() as seen:
        result, params = run_once(name, lambda progress, info: train(c, column, progress, info),
                                  out_dir, watchdog_s, on_watchdog, base)
    result.warnings = seen
    if params is not None:
        finished[name] = params
        write_params(out_dir, name, rank, params)
    write_result(out_dir, result)
    results = wait_for_results(out_dir, name, world, args.timeout_s + 20)
    if rank == 0:
        outcome = judge(name, results, None if base is None else digest(base), out_dir)
        print(json.dumps({"column": column.value, "world_size": world, "mesh": c.mesh.value,
                          **outcome}), flush=True)
    return process_group_intact(results)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--case", required=True, help="a case name, or several comma-separated")
    ap.add_argument("--column", choices=[c.value for c in Column], default=Column.STOCK.value)
    ap.add_argument("--timeout-s", type=float, default=30.0,
                    help="the process group's timeout (default 30)")
    ap.add_argument("--out-dir", type=Path, default=None,
                    help="where each rank writes its result files (default: per torchrun job)")
    args = ap.parse_args(argv)
    args.cases = [n.strip() for n in args.case.split(",") if n.strip()]
    try:
        args.mesh = mesh_of(args.cases)
        if args.timeout_s <= 0:
            raise BadInput(f"--timeout-s must be positive, got {args.timeout_s}")
        world = int(os.environ.get("WORLD_SIZE", str(args.mesh.world_size)))
        if world != args.mesh.world_size:
            raise BadInput(f"the {args.mesh.value} mesh needs {args.mesh.world_size} ranks, "
                           f"got {world}")
    except BadInput as exc:
        ap.error(str(exc))
    return args


def mesh_of(names: list[str] | tuple[str, ...]) -> MeshShape:
    """The one mesh every named case runs on (``BadInput``: none named, an unknown one, or
    cases on two meshes)."""
    meshes = {case(n).mesh for n in names}
    if len(meshes) != 1:
        raise BadInput(f"name cases on one mesh (one torchrun job), got {sorted(meshes) or 'none'}")
    return meshes.pop()


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    finished: Finished = {}
    run_in_order(args.cases, args.timeout_s, args.out_dir,
                 lambda name, out_dir: run_case(name, args, out_dir, finished))


if __name__ == "__main__":
    main()
