"""A peer that crashes, exits or ends early is reported as the failed collective it is — on the
surviving rank, never as a disagreement (``BucketMisalignment``) read from a half-reduced
control block.

These ranks are spawned here, not taken from the shared rank pool: a rank must really die."""

from __future__ import annotations

import datetime
import json
import multiprocessing as mp
import os
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from openclaw_ref.sync.base import SyncConfig
from openclaw_ref.sync.hardened import harden

LAST_GOOD_STEP = 1


def _rank(rank: int, tmp: Path, how: str, wire: str) -> None:
    torch.set_num_threads(1)
    store = dist.FileStore(str(tmp / "store"), 2)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=30))
    torch.manual_seed(0)
    ddp = DDP(nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1)), bucket_cap_mb=0.0002)
    state = harden(ddp, SyncConfig(name="hardened", wire=wire, watchdog_s=25.0))
    x = torch.full((4, 8), float(rank + 1))
    try:
        for step in range(5):
            state.begin_step(step)
            loss = ddp(x).square().mean()
            if rank == 1 and step > LAST_GOOD_STEP:
                if how == "raises":
                    raise RuntimeError("the user's code failed on rank 1")
                os._exit(0)  # "ended": left the loop early, without a word
            loss.backward()
            state.finish_step(step)
            dist.barrier()  # both ranks finished this step: the failure comes after it
        seen = ("finished", "")
    except BaseException as exc:  # noqa: B036 - reported to the parent, then the rank ends
        seen = (type(exc).__name__, str(exc))
    (tmp / f"rank{rank}.json").write_text(json.dumps(seen))
    os._exit(0)  # destroy_process_group can hang after a failed collective


@pytest.mark.parametrize("wire", ["fp32", "fp16"])
@pytest.mark.parametrize("how", ["raises", "ended"])
def test_a_dead_peer_is_reported_as_a_failed_collective_not_a_misalignment(tmp_path, how, wire):
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_rank, args=(r, tmp_path, how, wire)) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:  # rank 0 ends by itself: its collective fails, or the watchdog fires
        p.join(120)
        if p.is_alive():
            p.kill()
    kind, message = json.loads((tmp_path / "rank0.json").read_text())
    assert kind == "CollectiveFailed", (kind, message)
    assert f"step {LAST_GOOD_STEP + 1}" in message
    assert "BucketMisalignment" not in message and "control block" not in message
