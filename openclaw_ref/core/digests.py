"""Host-side SHA-256 digests of tensors over their exact bytes: what a run record and the
conformance suite's recorders keep to tell bitwise-equal parameters apart, after the fact.
(``harden()`` compares replicas live, on the device: ``sync/evidence/replica_digest.py``.)"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

import torch


def tensor_digest(t: torch.Tensor) -> str:
    """SHA-256 of a tensor's dtype, shape and bytes (moved to CPU, made contiguous)."""
    h = hashlib.sha256(f"{t.dtype}{tuple(t.shape)}".encode())
    h.update(t.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def params_digest(named: Iterable[tuple[str, torch.Tensor]]) -> str:
    """One digest over every named tensor in order: names, dtypes, shapes and bytes."""
    h = hashlib.sha256()
    for name, t in named:
        h.update(name.encode())
        h.update(tensor_digest(t).encode())
    return h.hexdigest()
