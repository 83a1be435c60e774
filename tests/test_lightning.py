"""openclaw under Lightning (seed 004): dynamic padding, class balancing, and our DDP strategy.

The Trainer cases run ``python -m openclaw_ref.integrations.lightning`` in a subprocess (Lightning's
launcher re-executes the script for every rank), in their own session with a hard timeout, and kill
that session afterwards so no rank outlives the test.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch

pytest.importorskip("lightning")

from openclaw_ref.arms.config import ArmConfig
from openclaw_ref.core.data import PAD, DataConfig, SkillDataset  # noqa: E402
from openclaw_ref.core.model import build_model, preset  # noqa: E402
from openclaw_ref.integrations.lightning import (  # noqa: E402
    OpenClawModule,
    SkillDataModule,
    SyncDDPStrategy,
    balancing_weights,
    pad_collate,
)

ROOT = Path(__file__).resolve().parents[1]
CFG = preset("tiny", seed=1)


@pytest.fixture(scope="module")
def datamodule() -> SkillDataModule:
    dm = SkillDataModule(CFG, DataConfig(n_train=512, n_val=64), batch_size=8, seed=1)
    dm.setup("fit")
    return dm


def test_batches_are_padded_to_their_own_longest_sample(datamodule):
    samples = datamodule.train_samples()
    widths = set()
    for start in range(0, 256, 8):
        batch = pad_collate([samples[i] for i in range(start, start + 8)])
        lengths = (batch["tokens"] != PAD).sum(1)
        assert batch["tokens"].shape[1] == int(lengths.max())  # no all-padding column
        widths.add(batch["tokens"].shape[1])
    assert min(widths) < CFG.seq_len  # padding to seq_len would waste compute here


def test_padding_sits_only_after_each_sample(datamodule):
    batch = pad_collate([datamodule.train_samples()[i] for i in range(16)])
    valid = batch["tokens"] != PAD
    lengths = valid.sum(1)
    assert torch.equal(valid, torch.arange(valid.shape[1])[None, :] < lengths[:, None])


def test_dynamic_padding_gives_the_same_logits_as_full_padding(datamodule):
    model = build_model(CFG).eval()
    ds: SkillDataset = datamodule.ds
    ids = (ds.lengths[:512] <= CFG.seq_len - 3).nonzero().flatten()[:24]  # short samples only
    short = pad_collate([datamodule.train_samples()[int(i)] for i in ids])
    full = ds.batch(ids)
    assert short["tokens"].shape[1] < full.tokens.shape[1]
    with torch.no_grad():
        torch.testing.assert_close(model(short["tokens"], short["sample_ids"], 5),
                                   model(full.tokens, full.sample_ids, 5))


def test_balancing_weights_equalize_expected_label_counts():
    labels = torch.tensor([0, 0, 0, 0, 1, 2, 2])
    w = balancing_weights(labels, n_classes=4)
    per_label = torch.zeros(4, dtype=torch.float64).index_add_(0, labels, w)
    torch.testing.assert_close(per_label, torch.tensor([1.0, 1.0, 1.0, 0.0], dtype=torch.float64))


def label_shares(dm: SkillDataModule) -> list[float]:
    counts: Counter = Counter()
    for batch in dm.train_dataloader():
        counts.update(batch["labels"].tolist())
    total = sum(counts.values())
    return [counts[k] / total for k in range(CFG.n_skills)]


def test_weighted_sampler_evens_out_imbalanced_labels():
    data = DataConfig(n_train=2048, n_val=64, imbalance=20.0)
    plain = label_shares(SkillDataModule(CFG, data, batch_size=64, seed=3))
    balanced = label_shares(SkillDataModule(CFG, data, batch_size=64, balance=True, seed=3))
    assert max(plain) / min(plain) > 8  # the imbalance is really there
    assert max(balanced) / min(balanced) < 1.6  # ~1/8 each, up to sampling noise
    assert all(abs(s - 1 / CFG.n_skills) < 0.04 for s in balanced)


def test_weighted_sampler_is_seeded():
    data = DataConfig(n_train=256, n_val=64, imbalance=5.0)
    a = SkillDataModule(CFG, data, batch_size=32, balance=True, seed=7)
    b = SkillDataModule(CFG, data, batch_size=32, balance=True, seed=7)
    assert list(a.sampler(a.train_samples())) == list(b.sampler(b.train_samples()))


def test_module_training_step_returns_a_finite_loss_with_grads(datamodule):
    module = OpenClawModule(CFG)
    batch = next(iter(datamodule.train_dataloader()))
    loss = module.training_step(batch, 0)
    loss.backward()
    assert torch.isfinite(loss)
    assert module.model.layer[3].attn.v_proj.weight.grad is not None


# --------------------------------------------------------------------------------------------
# Trainer(accelerator="cpu", devices=2, precision="bf16-mixed") in a subprocess


def run_trainer(tmp_path: Path, *args: str, timeout_s: float = 150) -> tuple[int, dict, str]:
    out = tmp_path / "result.json"
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    env.pop("MASTER_PORT", None)
    command = [sys.executable, "-m", "openclaw_ref.integrations.lightning", "--out", str(out),
               *args]
    proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        log, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        log = ""
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # Lightning's other ranks live in this session
        except ProcessLookupError:
            pass
        proc.wait()
    result = json.loads(out.read_text()) if out.exists() else {}
    return proc.returncode, result, log


def test_the_strategy_is_selected_by_its_registered_name():
    import lightning as L
    from lightning.pytorch.strategies import StrategyRegistry

    trainer = L.Trainer(strategy="openclaw_sync_ddp", accelerator="cpu", devices=2,
                        logger=False, enable_checkpointing=False)
    assert isinstance(trainer.strategy, SyncDDPStrategy)
    assert trainer.strategy.sync_cfg.name == "hardened"
    assert StrategyRegistry["ddp"]["strategy"] is not SyncDDPStrategy  # Lightning's own kept


def test_hardened_strategy_trains_under_lightning_on_cpu_and_runs_its_checks(tmp_path):
    """Under ``precision="16-mixed"``: Lightning's GradScaler and the hook's default
    ``nonfinite="skip"`` policy work together (no run-ending NonFiniteGradient)."""
    code, result, log = run_trainer(tmp_path, "--devices", "2", "--max-steps", "6",
                                    "--precision", "16-mixed", "--sync", "hardened",
                                    "--metrics-port", "0", "--skew-barrier-ms", "1.5")
    assert code == 0, log[-3000:]
    assert result["steps"] == 6 and result["accelerator"] == "cpu"
    assert result["checks_run"] > 0 and result["checks_passed"] == result["checks_run"]
    assert result["events"] == [] and result["final_loss"] is not None
    # every step went through the hardened hook: one verified bucket record per DDP bucket
    assert all(m["buckets"] and m["checks_run"] > 0 for m in result["step_metrics"])
    # the observers (exporter, P2 policy) ran under Lightning too, fed from the same metrics
    assert result["metrics_port"] > 0 and f"{result['metrics_port']}/metrics" in log
    metrics = result["step_metrics"]
    assert all(m["skew_source"] == "in-band" for m in metrics)
    for before, after in zip(metrics, metrics[1:]):
        assert after["skew_barrier"] is (before["rank_std_ms"] > 1.5)


# 12 s: the slow profile (CI budget); CI trains the hardened strategy under Lightning above
@pytest.mark.slow
def test_fault_injected_under_lightning_is_caught_by_the_hardened_checks(tmp_path):
    code, result, log = run_trainer(tmp_path, "--devices", "2", "--max-steps", "6",
                                    "--sync", "hardened", "--wire", "fp16",
                                    "--inject", "missing-grad@1")
    assert code == 3, log[-3000:]
    assert result["error"]["kind"] == "MissingGradient"
    assert result["error"]["ranks"] == [1] and result["error"]["step"] == 2


def build_through_the_strategy(ctx) -> dict:
    import torch
    from torch import nn

    from openclaw_ref.integrations.lightning import SyncDDPStrategy
    from openclaw_ref.sync.target import HARDENED_MARK

    strategy = SyncDDPStrategy(ArmConfig.of("hardened"), find_unused_parameters=False,
                               static_graph=True, gradient_as_bucket_view=True, bucket_cap_mb=1.0,
                               parallel_devices=[torch.device("cpu")] * ctx.world_size,
                               process_group_backend="gloo")
    ddp = strategy._setup_model(nn.Linear(4, 2))
    try:
        return {"find_unused_parameters": ddp.find_unused_parameters,
                "static_graph": ddp.static_graph,
                "gradient_as_bucket_view": ddp.gradient_as_bucket_view,
                "bucket_bytes_cap": ddp.bucket_bytes_cap,
                "hardened": getattr(ddp, HARDENED_MARK, None) is not None}
    finally:
        strategy.sync.close()


def test_the_users_ddp_options_reach_ddp_through_the_strategy(pools):
    for built in pools.get(2).run(build_through_the_strategy):
        assert built == {"find_unused_parameters": False, "static_graph": True,
                         "gradient_as_bucket_view": True, "bucket_bytes_cap": 2**20,
                         "hardened": True}
