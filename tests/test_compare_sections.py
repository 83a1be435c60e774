"""The fields ``compare`` records for the ledger's rules, each from a small real run.

- ``overflow.scale_mismatch`` (M4): the rank-dependent pre-scale on real DDP buckets;
- ``faults.cases`` of ``seed-f5`` (F5): the seed's hook as written, on the training loop;
- ``summary.peak_memory_scope`` (R4): a high-water mark reset per run;
- ``lightning`` and ``quantization`` (L2/L4): a real Lightning run, int8 of a trained model;
- the compact record: no per-rank duplicates, loadable by ``record.load_record``.
"""

from __future__ import annotations

import json
import os

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from openclaw_ref.arms.config import ArmConfig
from openclaw_ref.arms.registry import make_strategy
from openclaw_ref.arms.seed_f5 import SEED_SCALE
from openclaw_ref.core.data import DataConfig, SkillDataset, rank_batch
from openclaw_ref.core.jsonio import write_json_atomic
from openclaw_ref.core.metrics import peak_memory_mb, reset_peak_memory
from openclaw_ref.core.model import EVAL_STEP, build_model, preset
from openclaw_ref.core.train import TrainConfig
from openclaw_ref.experiments.runs import (
    SEED_NORM_NAMES,
    rotated,
    run_and_return_params,
    slim_run,
)
from openclaw_ref.experiments.sections import lightning
from openclaw_ref.experiments.sections.overflow import OVERFLOW_WORKLOADS, scale_mismatch_rank
from openclaw_ref.experiments.settings import CompareConfig
from openclaw_ref.reporting.record import SCHEMA_VERSION, load_record

CPU = torch.device("cpu")
TINY = preset("tiny", seed=1)


class Ctx:
    """The duck-typed rank context ``seed-f5`` needs: a device."""

    device = CPU


@pytest.fixture
def one_rank_group(tmp_path):
    """A 1-rank gloo group in this process (DDP needs one); torn down afterwards."""
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0,
                            world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def _train_seed_f5(steps: int, set_to_none: bool):
    ds = SkillDataset(TINY, DataConfig(seed=1))
    model = build_model(TINY)
    strategy = make_strategy(ArmConfig.of("seed-f5"))
    module = strategy.wrap(model, Ctx())
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    try:
        for step in range(steps):
            batch = rank_batch(ds, step, 8, 0, 1)
            F.cross_entropy(module(batch.tokens, batch.sample_ids, step), batch.labels).backward()
            opt.step()
            opt.zero_grad(set_to_none=set_to_none)
    finally:
        strategy.close()
    return model, strategy


# ---------------------------------------------------------------------------------------------
# F5: the seed's hook as written


def test_seed_f5_hook_sees_no_gradient_in_a_standard_loop(one_rank_group):
    """Forward hooks fire before this step's backward; zero_grad(set_to_none=True) (torch's
    default since 2.0) has removed the last step's gradients: nothing to scale or compare."""
    model, strategy = _train_seed_f5(3, set_to_none=True)
    s = strategy.summary()
    assert s["hooked_modules"] == 2 * TINY.n_layer  # SparseFFN + SparseGatingUnit per block
    assert s["hook_calls"] == 3 * TINY.n_layer  # only SparseFFN is called as a module
    assert s["grads_rescaled"] == 0 and s["assertions_over_present_grads"] == 0
    reference = build_model(TINY)  # the same loop without the hook: bitwise the same weights
    ds = SkillDataset(TINY, DataConfig(seed=1))
    opt = torch.optim.AdamW(reference.parameters(), lr=3e-3)
    for step in range(3):
        batch = rank_batch(ds, step, 8, 0, 1)
        F.cross_entropy(reference(batch.tokens, batch.sample_ids, step), batch.labels).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    for (n, a), b in zip(model.named_parameters(), reference.parameters()):
        assert torch.equal(a, b), n


def test_seed_f5_hook_with_kept_gradients_fails_a_clean_model(one_rank_group):
    """Where gradients do survive into the next forward (zero_grad(set_to_none=False)), the
    rank-0 assertion compares different parameters of one rank and fires on a fault-free
    model, after casting every gradient to fp16 × 2^12."""
    with pytest.raises(AssertionError, match="Shape mismatch in openclaw model"):
        _train_seed_f5(2, set_to_none=False)
    assert SEED_SCALE == 4096


def test_seed_f5_trains_exactly_like_stock_ddp_on_two_ranks(pools):
    """The fault matrix's 'none' case: same parameter digest as stock ddp, replicas equal."""
    digests = {}
    for name in ("ddp", "seed-f5"):
        cfg = TrainConfig(world_size=2, steps=3, global_batch=8, eval_every=0, progress=False,
                          backend="gloo", sync=ArmConfig.of(name))
        out = pools.get(2).run(run_and_return_params, cfg)[0]
        assert out["record"]["summary"]["replicas_equal"]
        digests[name] = out["record"]["summary"]["param_digest"]
        if name == "seed-f5":
            assert out["record"]["summary"]["sync"]["grads_rescaled"] == 0
    assert digests["ddp"] == digests["seed-f5"]


# ---------------------------------------------------------------------------------------------
# M4: rank-dependent pre-scale


def _mismatch(pools, world_size: int, steps: int) -> dict[str, dict]:
    cfg = TrainConfig(world_size=world_size, steps=steps, global_batch=8 * world_size,
                      eval_every=0, progress=False, backend="gloo",
                      sync=ArmConfig.of("ddp", bucket_cap_mb=0.025))
    return pools.get(world_size).run(scale_mismatch_rank, cfg, OVERFLOW_WORKLOADS)[0]


def _check_mismatch(rows: dict[str, dict], world_size: int, steps: int) -> None:
    assert set(rows) == set(OVERFLOW_WORKLOADS)
    for workload, r in rows.items():
        assert r["exponents"] == [12] * (world_size - 1) + [10]
        assert r["allreduces"] >= steps  # at least one bucket per step
        # the mismatch corrupts every bucket and splits the replicas; one shared scale does not
        assert r["corrupted"] == r["replicas_disagree"] == r["allreduces"], workload
        assert r["corrupted_uniform"] == 0, workload
        # a rank scaling *down* (2^10 < 2^12) never overflows more than the uniform 2^12
        assert r["overflowed"] <= r["overflowed_uniform"], workload
    assert rows["harsh"]["overflowed"] > 0  # × 10^U(-2, 2) × 2^12 exceeds fp16's range


def test_scale_mismatch_counts_overflow_and_corruption_on_two_ranks(pools):
    _check_mismatch(_mismatch(pools, 2, 3), 2, 3)


@pytest.mark.slow
def test_scale_mismatch_at_eight_ranks(pools):
    _check_mismatch(_mismatch(pools, 8, 4), 8, 4)


# ---------------------------------------------------------------------------------------------
# R4: peak memory per run


@pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="Linux /proc only")
def test_peak_memory_is_reset_at_each_run_start():
    scope = reset_peak_memory(CPU)
    big = torch.ones(64 * 2**20 // 4)  # 64 MiB, touched
    first = peak_memory_mb(CPU, scope)
    del big
    assert reset_peak_memory(CPU) == "run"
    second = peak_memory_mb(CPU, "run")
    assert second < first - 32  # the earlier run's peak is not inherited


# ---------------------------------------------------------------------------------------------
# L2/L4: Lightning and int8


def test_quantization_of_a_trained_model_reports_accuracy_and_latency():
    from openclaw_ref.experiments.quantize import ENGINES, measure

    ds = SkillDataset(TINY, DataConfig(seed=1))
    model = build_model(TINY)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for step in range(15):
        batch = rank_batch(ds, step, 32, 0, 1)
        F.cross_entropy(model(batch.tokens, batch.sample_ids, step), batch.labels).backward()
        opt.step()
        opt.zero_grad()
    q = measure(model, ds.validation(), EVAL_STEP, repeats=3)
    assert "error" not in q, q
    assert q["backend"] in ENGINES and q["samples"] == ds.validation().labels.numel()
    assert 0.0 <= q["accuracy_int8"] <= 1.0 and q["accuracy_fp32"] > 1.5 / TINY.n_skills
    assert abs(q["accuracy_delta"]) <= 0.1  # int8 Linear layers keep the model usable
    assert q["latency_fp32_ms"] > 0 and q["latency_int8_ms"] > 0
    assert q["method"].startswith(("dynamic", "fx")) and (q["fx_error"] is None) == \
        q["method"].startswith("fx")


class _Ticks:
    def tick(self, what: str) -> None:
        pass


# 15 s: the slow profile; CI runs Lightning itself in tests/test_lightning.py
@pytest.mark.slow
def test_lightning_section_comes_from_a_real_run():
    pytest.importorskip("lightning")
    cfg = CompareConfig(world_sizes=(1, 2), lightning_steps=3, backend="gloo")
    sec = lightning.run(cfg, None, _Ticks())
    assert "error" not in sec, sec.get("error")
    assert sec["devices"] == 2 and sec["steps"] == 3 and sec["accelerator"] == "cpu"
    assert "16" in sec["precision"] and sec["strategy"].startswith("ddp")
    assert sec["steps_per_s"] > 0 and sec["final_loss"] == sec["final_loss"]  # finite
    assert sec["seed_everything_workers"] is True and sec["weighted_sampler"] is True


# ---------------------------------------------------------------------------------------------
# Interleaving and the compact record


def test_rotation_puts_every_arm_first_once():
    arms = ["a", "b", "c"]
    assert [rotated(arms, r)[0] for r in range(3)] == arms
    assert all(sorted(rotated(arms, r)) == arms for r in range(5))


def test_slim_run_keeps_no_per_rank_duplicate():
    steps = [{"step": i, "loss": 1.0, "step_ms": 5.0, "rank_step_ms": [4.0, 5.0],
              "applied": True, "missing_grads": [0, 1], "grad_presence_agrees": False,
              "realized_sparsity": 0.3, "mask_entropy_bits": 0.8,
              "grad_norms": {n: [1.0, 2.0] for n in SEED_NORM_NAMES + ("layer.0.ffn.w1.weight",)},
              "sync": {"buckets": [{"skew_ms": 1.5, "ready_ms": [1.0, 2.5]}]}} for i in range(3)]
    slim = slim_run({"steps": steps, "summary": {}, "events": []})
    for dropped in ("rank_step_ms", "applied", "missing_grads", "realized_sparsity",
                    "mask_entropy_bits", "skew_ms"):
        assert dropped not in slim
    assert set(slim["grad_norms"]) == {SEED_NORM_NAMES[0]}  # the one C2 compares
    assert slim["step_ms"] == [5.0] * 3 and slim["skew_p99_ms"] == 1.5 and "skew_ms" not in slim
    curve = slim_run({"steps": steps, "summary": {}, "events": []}, schedule=True)
    assert curve["mask_entropy_bits"] == [0.8] * 3 and curve["skew_ms"] == [1.5] * 3
    assert set(curve["grad_norms"]) == set(SEED_NORM_NAMES)


def test_compact_record_loads(tmp_path):
    doc = {"schema_version": SCHEMA_VERSION,
           "meta": {"environment": {"backend": "gloo", "cpu_count": 2, "gpu_count": 0,
                                    "torch": torch.__version__},
                    "compare_config": {"repeats": 5}},
           "overflow": {"scale_mismatch": [{"world_size": 8, "allreduces": 120,
                                            "overflowed": 3, "corrupted": 120}]},
           "quantization": {"latency_fp32_ms": 1.0 / 3.0}}
    path = write_json_atomic(tmp_path / "m" / "raw.json", doc, compact=True, float_digits=6)
    text = path.read_text()
    assert "\n" not in text.rstrip("\n") and ": " not in text and ", " not in text
    rec = load_record(path)
    assert rec.doc["quantization"]["latency_fp32_ms"] == 0.333333
    assert json.loads(text)["overflow"] == doc["overflow"]


def test_scale_mismatch_counts_read_named_rows_of_every_rank():
    from openclaw_ref.experiments.probes import BucketMismatch, mismatch_counts

    clean = BucketMismatch(False, False, False, False, 0, False, False, False)
    off_here = clean._replace(off=True, replicas_differ=True, nonfinite_elements=2)
    counts = mismatch_counts([[clean, off_here, clean], [off_here, clean]])  # rank 1: 2 rows
    assert counts["allreduces"] == 2
    assert counts["corrupted"] == 2  # bucket 0 off on rank 1, bucket 1 off on rank 0
    assert counts["replicas_disagree"] == 1 and counts["overflow_elements"] == 2  # rank 0's
    assert counts["overflowed"] == counts["corrupted_uniform"] == 0


@pytest.mark.parametrize(("cores", "sizes", "expected"), [
    (2, (1, 2, 4), 2), (8, (1, 2, 4), 4), (2, (1,), 1), (1, (1, 2, 4), 4)])
def test_the_sparsity_control_runs_at_the_largest_size_the_host_fits(monkeypatch, cores, sizes,
                                                                     expected):
    from openclaw_ref.experiments.sections import ablations
    from openclaw_ref.experiments.settings import CompareConfig

    monkeypatch.setattr(ablations.os, "cpu_count", lambda: cores)
    cfg = CompareConfig(world_sizes=sizes, backend="gloo", global_batch=32)
    assert ablations.control_size(cfg) == expected


@pytest.mark.parametrize(("sizes", "expected"),
                         [((1, 2, 4), 2), ((1,), 2), ((4, 8), 8), ((1, 4), 4)])
def test_the_p2_arms_run_at_two_ranks_or_the_largest_size_never_at_one(sizes, expected):
    from openclaw_ref.experiments.sections import ablations
    from openclaw_ref.experiments.settings import CompareConfig

    assert ablations.p2_size(CompareConfig(world_sizes=sizes, backend="gloo")) == expected


def test_the_registry_runs_every_section_name_in_the_order_the_config_lists():
    from openclaw_ref.experiments.registry import SECTIONS
    from openclaw_ref.experiments.sections import NAMES

    assert tuple(SECTIONS) == NAMES == CompareConfig().sections
