"""The training loop under stock DDP: learning, the run JSON, and equivalence with one process."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from openclaw_ref.arms.config import ArmConfig
from openclaw_ref.core.train import TrainConfig, train_model
from openclaw_ref.sync.errors import BadInput
from tests.helpers import record_of, train_cfg


def final_parameters(ctx, cfg: TrainConfig) -> dict[str, torch.Tensor] | None:
    result = train_model(ctx, cfg)
    if not ctx.is_main:
        return None
    return {n: p.detach().clone() for n, p in result.model.named_parameters()}


@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_ddp_training_lowers_the_loss(pools, world_size):
    record = pools.get(world_size).run(record_of, train_cfg(world_size, steps=30))[0]
    losses = [s["loss"] for s in record["steps"]]
    assert sum(losses[-5:]) / 5 < 0.8 * sum(losses[:5]) / 5
    assert record["summary"]["replicas_equal"]


def test_four_ranks_equal_one_process_on_the_same_global_batch(pools):
    """SGD: fp32 round-off differs between a sum over 4 shards and over one batch (~1e-7).
    AdamW divides by sqrt(v) and turns round-off-sized gradients into ±lr steps, so its
    parameters may differ by more; its losses still agree (next test)."""
    one = pools.get(1).run(final_parameters, train_cfg(1, optimizer="sgd"))[0]
    four = pools.get(4).run(final_parameters, train_cfg(4, optimizer="sgd"))[0]
    worst = max(float((one[n] - four[n]).abs().max()) for n in one)
    assert worst <= 1e-5


def test_four_ranks_reach_the_loss_of_one_process_under_adamw(pools):
    one = pools.get(1).run(record_of, train_cfg(1))[0]["steps"]
    four = pools.get(4).run(record_of, train_cfg(4))[0]["steps"]
    for a, b in zip(one, four):
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-5)


def test_the_run_json_has_the_documented_sections(pools, tmp_path):
    out = tmp_path / "run.json"
    record = pools.get(2).run(record_of, train_cfg(2, steps=4, out=str(out)))[0]
    from openclaw_ref.core.jsonio import read_json

    on_disk = read_json(out)
    assert on_disk == record
    assert set(on_disk) >= {"config", "environment", "steps", "summary", "events"}
    assert on_disk["events"] == []
    assert {"step", "loss", "step_ms"} <= set(on_disk["steps"][0])
    assert {"final_loss", "param_digest"} <= set(on_disk["summary"])
    env = on_disk["environment"]
    assert env["world_size"] == 2 and env["backend"] == "gloo" and env["torch"]


def test_per_rank_gradient_norms_are_recorded_before_sync(pools):
    record = pools.get(2).run(record_of, train_cfg(2, steps=2))[0]
    norms = record["steps"][0]["grad_norms"]["layer.3.attn.v_proj.weight"]
    assert len(norms) == 2 and norms[0] != norms[1]  # different shards, different local grads


def test_idle_experts_show_up_as_missing_gradients(pools):
    record = pools.get(2).run(record_of, train_cfg(2, steps=3, global_batch=2))[0]
    assert all(sum(s["missing_grads"]) > 0 for s in record["steps"])


def test_ddp_fp16_trains_close_to_fp32(pools):
    fp32 = pools.get(2).run(record_of, train_cfg(2))[0]["summary"]["final_loss"]
    fp16 = pools.get(2).run(record_of, train_cfg(2, sync=ArmConfig.of("ddp-fp16")))[0]
    assert fp16["summary"]["final_loss"] == pytest.approx(fp32, rel=1e-2)


@pytest.mark.parametrize("kw,match", [
    ({"world_size": 0}, "world size"),
    ({"steps": 0}, "steps"),
    ({"global_batch": 30, "world_size": 4}, "multiple"),
    ({"sparsity_range": (0.7, 0.2)}, "empty"),
    ({"preset": "huge"}, "unknown preset"),
])
def test_bad_training_config_is_rejected_before_spawning(kw, match):
    with pytest.raises(BadInput, match=match):
        dataclasses.replace(TrainConfig(), **kw).validate()
