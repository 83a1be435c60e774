"""Rank-consistency checks that compare what every rank holds.

Each check returns or raises a ``ConsistencyError`` subclass naming the step, the parameters
and the ranks that disagree. Digests are SHA-256 over the exact bytes, so "equal" means
bitwise equal.
"""

from __future__ import annotations

import hashlib
from typing import Iterable

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
