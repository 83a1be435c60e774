"""The synthetic skill task: deterministic, sharded without overlap, imbalanced on demand."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from openclaw_ref.core.data import (
    DataConfig,
    SkillDataset,
    global_batch_ids,
    rank_batch,
    shard_ids,
    skill_priors,
)
from openclaw_ref.core.model import build_model, preset


@pytest.fixture(scope="module")
def ds():
    return SkillDataset(preset("tiny"), DataConfig(seed=3))


def test_same_seed_generates_the_same_dataset():
    a = SkillDataset(preset("tiny"), DataConfig(seed=5))
    b = SkillDataset(preset("tiny"), DataConfig(seed=5))
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.labels, b.labels)


@pytest.mark.parametrize("world_size", [1, 2, 4, 8])
def test_rank_shards_partition_the_global_batch(ds, world_size):
    ids = global_batch_ids(step=5, global_batch=32, n_train=ds.n_train, seed=3)
    shards = [rank_batch(ds, 5, 32, r, world_size).sample_ids for r in range(world_size)]
    assert torch.equal(torch.cat(shards), ids)
    assert len(set(torch.cat(shards).tolist())) == 32


def test_indivisible_global_batch_is_rejected():
    with pytest.raises(ValueError, match="not divisible"):
        shard_ids(torch.arange(10), rank=0, world_size=4)


def test_an_epoch_visits_every_training_sample_once():
    n = 64
    ids = torch.cat([global_batch_ids(s, 16, n, seed=1) for s in range(4)])
    assert sorted(ids.tolist()) == list(range(n))


def test_validation_split_is_disjoint_from_training(ds):
    assert ds.validation().sample_ids.min() >= ds.n_train


def test_padding_follows_the_last_valid_token(ds):
    valid = ds.tokens != 0
    assert torch.equal(valid.sum(1), ds.lengths)
    assert torch.all(valid[:, 0])


def test_imbalance_sets_the_ratio_of_most_to_least_frequent_skill():
    p = skill_priors(8, imbalance=10.0)
    assert p[0] / p[-1] == pytest.approx(10.0, rel=1e-4)
    assert torch.allclose(skill_priors(8, 1.0), torch.full((8,), 1 / 8))


def test_imbalance_below_one_is_rejected():
    with pytest.raises(ValueError, match="imbalance"):
        DataConfig(imbalance=0.5)


# 17 s of training: the slow profile (tox -e slow); CI keeps the data's own unit tests
@pytest.mark.slow
def test_the_tiny_model_learns_the_task_within_200_steps(ds):
    """In-process, one rank: validation loss falls clearly (chance is ln 8 ≈ 2.08)."""
    torch.manual_seed(0)
    model = build_model(preset("tiny", seed=1))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    val = ds.validation()

    def val_loss() -> float:
        with torch.no_grad():
            return float(F.cross_entropy(model(val.tokens, val.sample_ids, -1), val.labels))

    start = val_loss()
    for step in range(200):
        b = rank_batch(ds, step, 32, 0, 1)
        F.cross_entropy(model(b.tokens, b.sample_ids, step), b.labels).backward()
        opt.step()
        opt.zero_grad()
    end = val_loss()
    assert start > 1.9
    assert end < 0.5 * start
