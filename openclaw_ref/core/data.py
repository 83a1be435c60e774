"""A deterministic synthetic skill-classification task, sharded across ranks without overlap.

Why synthetic: the suite must run anywhere without downloads, and equivalence tests need every
sample to be a pure function of ``(seed, index)``. The task is learnable but not trivial: each
skill owns a few signature tokens, a sample of that skill carries some of them at random
positions among noise tokens, and sample lengths vary (token 0 is padding). Skill labels follow
a controllable imbalance (seed 004's class-imbalance pitfall).

Sharding invariant: step ``k``'s global batch is a fixed list of ``G`` dataset indices; rank
``r`` of ``W`` takes the contiguous slice ``[r·G/W, (r+1)·G/W)``. So W ranks see exactly the
samples one process sees with batch G, in the same order.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import torch

from openclaw_ref.core.model import OpenClawConfig

PAD = 0
SIGNATURES_PER_SKILL = 4


@dataclass(frozen=True)
class DataConfig:
    n_train: int = 4096
    n_val: int = 256
    imbalance: float = 1.0  # frequency of the most common skill ÷ the rarest; 1 = balanced
    signatures_per_sample: int = 3
    min_len_fraction: float = 0.5
    seed: int = 0

    def __post_init__(self) -> None:
        if self.imbalance < 1.0:
            raise ValueError(f"imbalance must be >= 1 (1 = balanced); got {self.imbalance}")
        if self.n_train < 1 or self.n_val < 1:
            raise ValueError("n_train and n_val must be >= 1")


@dataclass(frozen=True)
class Batch:
    tokens: torch.Tensor  # (B, T) int64, 0 = pad
    labels: torch.Tensor  # (B,) int64 skill ids
    sample_ids: torch.Tensor  # (B,) int64 global dataset indices

    def to(self, device: torch.device | str) -> Batch:
        return Batch(self.tokens.to(device), self.labels.to(device), self.sample_ids.to(device))


def skill_priors(n_skills: int, imbalance: float) -> torch.Tensor:
    """Geometric class priors: p_0 / p_{n-1} == imbalance."""
    if n_skills == 1:
        return torch.ones(1)
    logits = -torch.arange(n_skills, dtype=torch.float64) / (n_skills - 1) * torch.log(
        torch.tensor(imbalance, dtype=torch.float64))
    return logits.softmax(0).to(torch.float32)


class SkillDataset:
    """Train and validation splits generated at once from the seed; indices are global ids."""

    def __init__(self, model_cfg: OpenClawConfig, cfg: DataConfig) -> None:
        n_sig = model_cfg.n_skills * SIGNATURES_PER_SKILL
        if n_sig + 2 > model_cfg.vocab_size:
            raise ValueError(
                f"vocab_size {model_cfg.vocab_size} too small for {model_cfg.n_skills} skills")
        self.model_cfg = model_cfg
        self.cfg = cfg
        total = cfg.n_train + cfg.n_val
        g = torch.Generator().manual_seed(cfg.seed)
        T = model_cfg.seq_len
        labels = torch.multinomial(skill_priors(model_cfg.n_skills, cfg.imbalance), total,
                                   replacement=True, generator=g)
        noise = torch.randint(n_sig + 1, model_cfg.vocab_size, (total, T), generator=g)
        min_len = max(cfg.signatures_per_sample, int(T * cfg.min_len_fraction))
        lengths = torch.randint(min_len, T + 1, (total,), generator=g)
        tokens = noise
        for _ in range(cfg.signatures_per_sample):
            pos = (torch.rand(total, generator=g) * lengths).long()
            sig = 1 + labels * SIGNATURES_PER_SKILL + torch.randint(
                0, SIGNATURES_PER_SKILL, (total,), generator=g)
            tokens[torch.arange(total), pos] = sig
        tokens[torch.arange(T)[None, :] >= lengths[:, None]] = PAD
        self.tokens, self.labels = tokens, labels
        self.lengths = lengths

    @property
    def n_train(self) -> int:
        return self.cfg.n_train

    def batch(self, ids: torch.Tensor) -> Batch:
        return Batch(self.tokens[ids], self.labels[ids], ids.clone())

    def validation(self) -> Batch:
        ids = torch.arange(self.cfg.n_train, self.cfg.n_train + self.cfg.n_val)
        return self.batch(ids)


@lru_cache(maxsize=8)
def _epoch_order(seed: int, epoch: int, n: int) -> torch.Tensor:
    return torch.randperm(n, generator=torch.Generator().manual_seed(seed * 7919 + epoch))


def global_batch_ids(step: int, global_batch: int, n_train: int, seed: int) -> torch.Tensor:
    """The G dataset indices of a step: consecutive positions of seeded per-epoch permutations."""
    positions = step * global_batch + torch.arange(global_batch)
    epochs, offsets = positions // n_train, positions % n_train
    return torch.stack([_epoch_order(seed, int(e), n_train)[int(o)]
                        for e, o in zip(epochs, offsets)])


def shard_ids(global_ids: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
    """Rank r's contiguous slice of the global batch; the batch must divide evenly."""
    G = global_ids.numel()
    if G % world_size:
        raise ValueError(f"global batch {G} is not divisible by world size {world_size}")
    b = G // world_size
    return global_ids[rank * b:(rank + 1) * b]


def rank_batch(ds: SkillDataset, step: int, global_batch: int, rank: int, world_size: int) -> Batch:
    ids = shard_ids(global_batch_ids(step, global_batch, ds.n_train, ds.cfg.seed), rank, world_size)
    return ds.batch(ids)
