"""What several compare sections share: the training rank task, the slimmed run record, the
bucket skews of a run and the interleaving order of repeated arms.

Rank tasks live at module top level so spawned ranks can import them.
"""

from __future__ import annotations

from typing import TypeVar

from openclaw_ref.core.launch import RankContext
from openclaw_ref.core.metrics import percentile
from openclaw_ref.core.train import TrainConfig, train_model

T = TypeVar("T")

# Local gradient norms kept in the record: the parameters the seed names. Strategy runs keep
# the first (C2 compares it across ranks), curves both (S2 checks the names exist). The run
# records watch more; the raw JSON keeps only these.
SEED_NORM_NAMES = ("layer.3.attn.v_proj.weight", "layer.5.ffn.w1.weight")


def run_and_return_params(ctx: RankContext, cfg: TrainConfig) -> dict | None:
    """Train; rank 0 returns its record plus its final parameters for the correctness column.

    The record's ``summary.peak_memory_scope`` says what ``peak_memory_mb`` covers: ``"run"``
    when the training loop reset the high-water mark at the run's start (Linux, CUDA), else
    ``"process"`` (the worker's lifetime peak: the pool is reused across runs)."""
    result = train_model(ctx, cfg)
    if not ctx.is_main:
        return None
    params = {n: p.detach().to("cpu").clone() for n, p in result.model.named_parameters()}
    return {"record": result.record, "params": params}


def bucket_skews(record: dict) -> list[float]:
    """Every bucket's skew (max − min of the ranks' ready times, ms) of every step of a run."""
    return [b["skew_ms"] for s in record["steps"] for b in s["sync"].get("buckets", [])
            if b.get("skew_ms") is not None]


def slim_run(record: dict, *, schedule: bool = False) -> dict:
    """The figures of one run that the tables and the ledger read, stored once each.

    Left out on purpose (the committed record stays under 1 MB): per-rank step times (the
    slowest rank's are ``step_ms``), per-step applied flags (``summary.skipped_steps``) and
    per-rank missing-gradient counts (``grad_presence_agrees``), and the per-bucket skews
    (their p50/p99 are kept; C3 reads the p99 per run). ``schedule=True`` (the curve runs)
    also keeps the skews (to 0.01 ms), the per-step sparsity and mask entropy — a function of
    the seed and the step, identical in every strategy run — and the norms of every
    seed-named parameter (strategy runs: the first only)."""
    steps = record["steps"]
    skews = bucket_skews(record)
    names = SEED_NORM_NAMES if schedule else SEED_NORM_NAMES[:1]
    norms = {n: [s["grad_norms"][n] for s in steps] for n in names if n in steps[0]["grad_norms"]}
    out = {
        "summary": record["summary"],
        "events": record["events"],
        "step_ms": [s["step_ms"] for s in steps],
        "loss": [s["loss"] for s in steps],
        "grad_presence_agrees": [s["grad_presence_agrees"] for s in steps],
        "skew_p50_ms": percentile(skews, 50) if skews else None,
        "skew_p99_ms": percentile(skews, 99) if skews else None,
        "grad_norms": norms,
        "sync_last": steps[-1]["sync"],
        "validation": record.get("validation", []),
    }
    if schedule:
        out["skew_ms"] = [round(x, 2) for x in skews]
        out["realized_sparsity"] = [s["realized_sparsity"] for s in steps]
        out["mask_entropy_bits"] = [s["mask_entropy_bits"] for s in steps]
    return out


def rotated(items: list[T], repeat: int) -> list[T]:
    """``items`` rotated by ``repeat``: each arm goes first in turn, so a drift in the host's
    load hits every arm alike across repeats (the arms are then paired by repeat index)."""
    k = repeat % len(items) if items else 0
    return items[k:] + items[:k]
