"""The compute canary on your model, under DDP or ``--openclaw-wrapper fsdp2/hsdp``: a rank whose
matmuls compute wrong is named within 2 K steps (with two ranks there is no majority: both are
named as suspects), and with no fault the canary raises nothing
and training is bitwise what it is without it (``conformance/canary_run.py``). A model that
runs no fp32 matmul the injector can corrupt is skipped for the fault test (say so: the canary
then has nothing of that kind to see). Under ``--openclaw-wrapper fsdp2-tp`` both skip: the probe
runs the model on plain tensors, which a TP-sharded module cannot take, so ``harden()`` turns
the canary off there with a ``CanaryOff`` event (docs/meshes.md)."""

from __future__ import annotations

import pytest
import torch

from openclaw_ref.conformance.canary_run import canary_task
from openclaw_ref.conformance.target import TP_WRAPPER

pytestmark = [pytest.mark.conformance]

K = 2


@pytest.fixture(autouse=True)
def _not_on_tensor_parallel(target_spec):
    if target_spec.wrapper == TP_WRAPPER:
        pytest.skip("the compute canary does not run on a tensor-parallel model: harden() "
                    "turns it off with a CanaryOff event (docs/meshes.md)")


def test_the_canary_names_the_rank_whose_matmuls_compute_wrong(pools, target_spec):
    world = target_spec.world_size
    replies = pools.get(world).run(canary_task, target_spec.factory, K, 6, "sdc-ulp", 2,
                                   target_spec.wrapper)
    if not replies[-1]["fired"]:
        pytest.skip("the model runs no fp32 matmul the SDC injector corrupts")
    errors = [r["error"] for r in replies]
    assert all(e == errors[0] for e in errors), errors
    assert errors[0] is not None and errors[0]["kind"] == "ComputeMismatch", errors[0]
    suspects = [world - 1] if world > 2 else list(range(world))
    assert errors[0]["ranks"] == suspects and errors[0]["step"] <= 2 + 2 * K


def test_the_canary_raises_nothing_and_leaves_training_bitwise_as_it_was(pools, target_spec):
    pool = pools.get(target_spec.world_size)
    off, on = (pool.run(canary_task, target_spec.factory, every, 4, "", 0, target_spec.wrapper)
               for every in (0, 1))
    for a, b in zip(off, on):
        assert a["error"] is None and b["error"] is None, (a["error"], b["error"])
        assert b["events"] == a["events"], b["events"]
        for name, p in a["params"].items():
            assert torch.equal(p, b["params"][name]), name
