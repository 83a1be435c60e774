"""The compute canary never fires on a healthy job and leaves training bitwise as it was: the
weights, buffers and RNG state with the canary at every step equal those without it, on the
healthy-jobs corpus and the DDP option matrix (``experiments/canary_healthy.py``); FSDP2 takes
it too (its on/off proof and SDC runs: ``tests/test_fsdp_canary.py``)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from openclaw_ref.experiments.canary_healthy import (
    HealthyJob,
    healthy_task,
    option_task,
    step_guard_cases,
)
from openclaw_ref.sync.base import SyncConfig
from openclaw_ref.sync.hardening import harden


def _bitwise_equal(a: dict, b: dict) -> None:
    for part in ("params", "buffers"):
        assert a[part].keys() == b[part].keys()
        for name in a[part]:
            assert torch.equal(a[part][name], b[part][name]), (part, name)
    assert torch.equal(a["rng"], b["rng"])


def _quiet(reply: dict, off: dict) -> None:
    """No error, and no event the canary-off run did not have (a GradScaler's deliberate
    overflows are skipped steps, with an event, in both runs)."""
    assert reply["error"] is None, reply["error"]
    assert reply["events"] == off["events"], reply["events"]


@pytest.mark.parametrize("job", list(HealthyJob))
def test_a_healthy_job_trains_bitwise_the_same_with_the_canary_and_raises_nothing(pools, job):
    pool = pools.get(2)
    off, on = pool.run(healthy_task, job, 0), pool.run(healthy_task, job, 1)
    for a, b in zip(off, on):
        _quiet(a, {"events": []})
        _quiet(b, a)
        assert b["probes"] >= 3  # the canary really probed
        _bitwise_equal(a, b)


@pytest.mark.parametrize("case", step_guard_cases(), ids=lambda c: c.name)
def test_every_ddp_option_trains_bitwise_the_same_with_the_canary(pools, case):
    world = max((max(g) for g in case.subgroups), default=1) + 1
    pool = pools.get(world)
    off, on = pool.run(option_task, case, 0), pool.run(option_task, case, 1)
    for a, b in zip(off, on):
        _quiet(b, a)
        assert a["error"] is None
        assert case.join or b["probes"] >= 1  # inside DDP.join() the canary pauses
        assert a["scales"] == b["scales"]
        _bitwise_equal(a, b)


def fsdp_canary_task(ctx) -> int:
    """harden() asked for the canary on a bare FSDP2 root: the probes it ran in three steps."""
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
    fully_shard(model, mesh=init_device_mesh("cpu", (dist.get_world_size(),)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    guard = harden(model, SyncConfig(canary_every=1))
    for step in range(3):
        model(torch.full((4, 4), float(step + ctx.rank))).sum().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    guard.close()
    return guard.canary.probes


def test_fsdp2_takes_the_canary_and_probes_every_k_steps(pools):
    """FSDP2 (and HSDP) have the canary now: asked for one, harden() runs it — a probe at
    each step after the first capture (K = 1)."""
    assert pools.get(2).run(fsdp_canary_task) == [2, 2]


# ~15 s (a Lightning job): the slow profile
@pytest.mark.slow
def test_under_lightning_the_canary_says_it_cannot_probe_and_leaves_training_alone(tmp_path):
    """Lightning redirects DDP's forward to training_step for each call; the probe cannot run
    that without the step's side effects (its logging), so the canary turns off with an event
    on every rank and the run completes."""
    from tests.test_lightning import run_trainer

    code, result, log = run_trainer(tmp_path, "--devices", "2", "--max-steps", "4",
                                    "--precision", "32", "--canary-every", "2")
    assert code == 0, log[-3000:]
    assert [e["kind"] for e in result["events"]] == ["CanaryUnavailable"]
    assert result["events"][0]["ranks"] == [0, 1] and result["steps"] == 4
