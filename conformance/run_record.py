"""What one rank saw in one run of a user target (``RunRecord``): the record the DDP run
(``user_record.record_run``), the FSDP2 run (``fsdp_run.record_fsdp_run``) and the FSDP2 × TP
run (``tp_run.record_tp_run``) fill and every check of ``user_checks`` reads.

Why a module of its own: ``record_run`` hands an FSDP2 target to ``fsdp_run``, which fills the
same record; here, below both, neither imports the other back.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch

BucketValues = tuple[int, torch.Tensor, torch.Tensor]  # (bucket index, local, hook's result)


@dataclass
class RunRecord:
    """What one rank saw in one run. ``hooked``: a user's hook was registered (else the run is
    stock DDP's own reduction). ``start``, ``states`` and ``one_process`` are the heavy part
    (``light()`` drops them); ``error`` is the event of a ``ConsistencyError`` that stopped
    the run (a hook's own check), with its text in ``error_text``."""

    rank: int
    hooked: bool
    param_names: tuple[str, ...] = ()
    start: dict[str, torch.Tensor] = field(default_factory=dict)
    states: list[dict[str, torch.Tensor]] = field(default_factory=list)
    param_digests: list[tuple[str, ...]] = field(default_factory=list)
    step_buffers: list[str] = field(default_factory=list)
    layouts: list[tuple] = field(default_factory=list)
    buckets: list[list[BucketValues]] = field(default_factory=list)
    error: dict | None = None
    error_text: str = ""
    events: list[dict] = field(default_factory=list)  # FSDP2: the subject's events (fsdp_run)
    warnings: list[str] = field(default_factory=list)  # fsdp2-tp: every warning the run gave
    # fsdp2-tp, per step: each tp-replicated parameter's (replica key, digest of this rank's
    # local values); ranks with the same key hold replicas (``sync.fsdp.mesh.Seat``)
    tp_replicas: list[dict[str, tuple[int, str]]] = field(default_factory=list)
    one_process: dict[str, torch.Tensor] | None = None

    def light(self) -> RunRecord:
        return replace(self, start={}, states=[], one_process=None)
