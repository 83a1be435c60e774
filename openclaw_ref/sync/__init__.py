"""The hook library: ``harden()``, which guards a user's DDP or FSDP2 job, and what it runs.

What users import: ``harden`` (``hardening.py``), its config ``SyncConfig`` (``base.py``), the
guard it returns (``guard.py``'s ``GuardBase``) and the errors it raises (every exception class
of ``errors``: ``ConsistencyError`` and its checks, ``CollectiveFailed``, ``SyncTimeout``,
``JobFailed``, ``BadInput``). ``ddp/`` and ``fsdp/`` adapt it to each wrapper, on the evidence
of ``evidence/`` and the compute canary of ``canary/``. Only what ``harden()`` runs lives
here: the benchmark's arms (stock DDP, the seed's fixes) live beside it, in
``openclaw_ref.arms``.

Invariant: ``openclaw_ref.sync`` imports only torch and its own modules (never the launcher,
the training loop or anything else of ``openclaw_ref``), so it can be lifted out whole;
``tests/test_sync_standalone.py`` proves it. The names below load on first use (PEP 562), so
importing a torch-free module of the package (``openclaw_ref.sync.errors``) does not import
torch: ``openclaw-bench --help`` stays fast."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from openclaw_ref.sync.base import SyncConfig
    from openclaw_ref.sync.ddp.harden_state import HardenState
    from openclaw_ref.sync.errors import (
        BadInput,
        BucketMisalignment,
        CheckpointMismatch,
        ClockMismatch,
        CollectiveFailed,
        ComputeMismatch,
        ConsistencyError,
        GradientsNotAveraged,
        InputMismatch,
        JobFailed,
        MissingGradient,
        NonFiniteGradient,
        OpenClawError,
        OptimizerMismatch,
        ParameterMismatch,
        ReplicaDivergence,
        ScaleMismatch,
        ShapeMismatch,
        SyncTimeout,
    )
    from openclaw_ref.sync.hardening import harden

_HOME = {
    "HardenState": "ddp.harden_state",
    "SyncConfig": "base",
    "harden": "hardening",
    # errors.py imports only the standard library: catching one of these loads no torch
    **dict.fromkeys(("BadInput", "BucketMisalignment", "CheckpointMismatch", "ClockMismatch",
                     "CollectiveFailed", "ComputeMismatch", "ConsistencyError",
                     "GradientsNotAveraged", "InputMismatch", "JobFailed", "MissingGradient",
                     "NonFiniteGradient", "OpenClawError", "OptimizerMismatch",
                     "ParameterMismatch", "ReplicaDivergence", "ScaleMismatch", "ShapeMismatch",
                     "SyncTimeout"),
                    "errors"),
}


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_HOME[name]}"), name)
    globals()[name] = value
    return value


__all__ = [
    "HardenState", "SyncConfig", "harden",
    "BadInput", "BucketMisalignment", "CheckpointMismatch", "ClockMismatch", "CollectiveFailed",
    "ComputeMismatch", "ConsistencyError",
    "GradientsNotAveraged", "InputMismatch", "JobFailed", "MissingGradient", "NonFiniteGradient",
    "OpenClawError",
    "OptimizerMismatch", "ParameterMismatch", "ReplicaDivergence", "ScaleMismatch",
    "ShapeMismatch", "SyncTimeout",
]
