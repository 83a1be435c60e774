"""A peer that crashes, exits or ends early is reported as the failed collective it is — on the
surviving rank, never as a disagreement (``BucketMisalignment``) read from a half-reduced
control block.

These ranks are spawned here, not taken from the shared rank pool: a rank must really die."""

from __future__ import annotations

import datetime
import json
import os
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from openclaw_ref.core.rank_start import rank_context
from openclaw_ref.sync.base import SyncConfig
from openclaw_ref.sync.hardening import harden

LAST_GOOD_STEP = 1


class Branchy(nn.Module):
    """An input layer, a trunk and a head, under find_unused_parameters=False; rank 1 may skip
    the input layer, whose gradients are ready last (DDP's last bucket), or the head, whose
    gradients are ready first (DDP's bucket 0)."""

    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Linear(8, 8)
        self.trunk = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
        self.head = nn.Linear(1, 1)

    def forward(self, x: torch.Tensor, skip: str | None = None) -> torch.Tensor:
        h = self.trunk(x if skip == "first" else self.first(x))
        return h if skip == "head" else self.head(h)


def _rank(rank: int, tmp: Path, how: str, wire: str) -> None:
    torch.set_num_threads(1)
    store = dist.FileStore(str(tmp / "store"), 2)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=30))
    torch.manual_seed(0)
    ddp = DDP(Branchy(), bucket_cap_mb=0.0002)
    state = harden(ddp, SyncConfig(wire=wire, watchdog_s=25.0))
    x = torch.full((4, 8), float(rank + 1))
    step = 0
    try:
        for step in range(5):
            state.begin_step(step)
            failing = rank == 1 and step > LAST_GOOD_STEP
            skip = {"skips": "first", "skips-head": "head"}.get(how) if failing else None
            loss = ddp(x, skip=skip).square().mean()
            if failing and how == "raises":
                raise RuntimeError("the user's code failed on rank 1")
            if failing and how == "ended":
                os._exit(0)  # left the loop early, without a word
            loss.backward()
            state.finish_step(step)
            if step <= LAST_GOOD_STEP:
                dist.barrier()  # both ranks finished this step: the failure comes after it
        seen = ("finished", "", step)
    except BaseException as exc:  # noqa: B036 - reported to the parent, then the rank ends
        seen = (type(exc).__name__, str(exc), step)
    (tmp / f"rank{rank}.json").write_text(json.dumps(seen))
    os._exit(0)  # destroy_process_group can hang after a failed collective


def _run(tmp_path: Path, how: str, wire: str) -> list[tuple[str, str, int]]:
    """Both ranks' (exception type, message, step), once rank 0 has ended by itself (its
    collective fails, or the watchdog ends it: then there is no rank0.json)."""
    ctx = rank_context()  # as the launcher starts ranks
    procs = [ctx.Process(target=_rank, args=(r, tmp_path, how, wire)) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:  # rank 0 ends by itself: its collective fails, or the watchdog fires
        p.join(120)
        if p.is_alive():
            p.kill()
    replies = []
    for r in range(2):
        path = tmp_path / f"rank{r}.json"
        replies.append(tuple(json.loads(path.read_text())) if path.exists() else None)
    return replies


# the fp16 wire's cases: the slow profile (CI budget); the fp32 ones run the same code path
@pytest.mark.parametrize("wire", ["fp32", pytest.param("fp16", marks=pytest.mark.slow)])
@pytest.mark.parametrize("how", ["raises", "ended"])
def test_a_dead_peer_is_reported_as_a_failed_collective_not_a_misalignment(tmp_path, how, wire):
    kind, message, step = _run(tmp_path, how, wire)[0]
    assert kind == "CollectiveFailed", (kind, message)
    assert step == LAST_GOOD_STEP + 1 and f"step {LAST_GOOD_STEP + 1}" in message
    assert "BucketMisalignment" not in message and "control block" not in message


@pytest.mark.parametrize("how,first_unissued", [("skips", None), ("skips-head", 0)],
                         ids=["last-bucket", "bucket-0"])
def test_a_rank_whose_ddp_never_reduces_its_last_bucket_stops_every_rank_at_the_same_step(
        tmp_path, how, first_unissued):
    """Rank 1 skips a parameter under find_unused_parameters=False: its DDP never issues that
    parameter's bucket nor any after it, so rank 0 waits inside that bucket's allreduce, where
    nothing can raise into it. Rank 1 learns it at its next call into the library (skipped
    input layer: DDP's last bucket) or at the end of its backward (skipped head: bucket 0, so
    its DDP issued no bucket at all) and sends the buckets it skipped as zeros, marked "never
    issued": both ranks raise the same MissingGradient naming rank 1, at the same step and
    bucket — no hang until the watchdog, no misalignment, no failed collective, and not the
    GradientsNotAveraged that a backward with no bucket would otherwise be. (Its false-alarm
    side: every healthy pattern of the false-alarm corpus,
    ``conformance/suite/test_false_alarms.py``, and every hardened test would raise it.)"""
    replies = _run(tmp_path, how, "fp32")
    assert all(r is not None for r in replies), replies  # both ranks reported, none was killed
    (kind0, message0, step0), (kind1, message1, step1) = replies
    assert kind0 == kind1 == "MissingGradient", (message0, message1)
    assert message0 == message1 and step0 == step1 == LAST_GOOD_STEP + 1
    assert f"step {step0}" in message0 and "ranks [1]" in message0
    assert "DDP never reduced this backward's last bucket" in message0
    if first_unissued is not None:
        assert f"stopped before bucket {first_unissued}" in message0
