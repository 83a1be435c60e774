"""What a TP corpus run ended in, judged from what every rank wrote about itself: the FSDP2
corpus's verdict (``fsdp_corpus.outcome.classify``: detected, silent corruption, crash, hang,
no effect) and what a tensor-parallel job adds to it — how far the copies of a replicated
parameter drifted apart, which parameters, the warnings each rank printed, each rank's digest.

Every rank that finished writes its full parameters (``full_tensor()`` of each: gathered over
the dims that shard it, its own copy of the dims that replicate it) beside its result. A
parameter's copies are therefore equal on every rank exactly when its replicas agree, so the
largest element-wise spread over the ranks is the replica drift the stock column shows: a
sharded parameter's full tensor is the same everywhere; a replicated one's is not, once its
replicas differ. Arrays are read with ``allow_pickle=False``.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import torch

from openclaw_ref.core.jsonio import write_bytes_atomic
from openclaw_ref.fsdp_corpus.outcome import RankResult, classify


def params_path(out_dir: Path, name: str, rank: int) -> Path:
    return out_dir / f"{name}.rank{rank}.npz"


def write_params(out_dir: Path, name: str, rank: int, params: dict[str, torch.Tensor]) -> None:
    """This rank's full parameters after the run, atomically (float64, by name)."""
    buf = io.BytesIO()
    np.savez(buf, **{k: v.detach().double().numpy() for k, v in params.items()})
    write_bytes_atomic(params_path(out_dir, name, rank), buf.getvalue())


def replica_drift(out_dir: Path, name: str, world_size: int) -> dict[str, float]:
    """Per parameter, the largest spread of any element over the ranks that wrote their
    parameters (none when fewer than two did)."""
    arrays = []
    for rank in range(world_size):
        path = params_path(out_dir, name, rank)
        if path.exists():
            with np.load(path, allow_pickle=False) as npz:
                arrays.append({k: npz[k] for k in npz.files})
    if len(arrays) < 2:
        return {}
    return {k: float((np.max([a[k] for a in arrays], axis=0)
                      - np.min([a[k] for a in arrays], axis=0)).max()) for k in arrays[0]}


def judge(name: str, results: dict[int, RankResult | None], reference: str | None,
          out_dir: Path, **how) -> dict:
    """The outcome of case ``name`` (``classify``'s, ``how``: its keywords) with the ranks' own
    accounts: the parameters the error named, the largest replica drift and the parameters
    that drifted, the warnings and digest per rank."""
    outcome = classify(name, results, reference, **how).to_json()
    detections = [r.detection for r in results.values() if r is not None and r.detection]
    drift = replica_drift(out_dir, name, len(results))
    return {**outcome,
            "params": list((detections[0] or {}).get("params") or []) if detections else [],
            "drift": max(drift.values()) if drift else None,
            "drift_params": sorted(k for k, v in drift.items() if v > 0),
            "warnings": {r: list(res.warnings) for r, res in results.items()
                         if res is not None and res.warnings},
            "digests": {r: res.digest for r, res in results.items()
                        if res is not None and res.digest}}


def bitwise_equal(stock: dict, hardened: dict) -> bool | None:
    """Whether the two columns ended with bitwise the same parameters on every rank (None:
    a column has a rank without a digest, it did not finish)."""
    a, b = stock.get("digests") or {}, hardened.get("digests") or {}
    ranks = range(int(stock["world_size"]))
    if not all(str(r) in a and str(r) in b for r in ranks):
        return None
    return all(a[str(r)] == b[str(r)] for r in ranks)
