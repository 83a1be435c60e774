"""The synthetic skill task (``openclaw_ref.core.data``) for Lightning, padded per batch.

``pad_collate`` pads each batch to its own longest sample (token 0 = padding, which the model
masks); ``SkillDataModule`` can draw training samples through a seeded ``WeightedRandomSampler``
that balances imbalanced skill labels (seed 004, L4).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import lightning as L
import torch
from torch.utils.data import DataLoader, Dataset, WeightedRandomSampler

from openclaw_ref.core.data import PAD, DataConfig, SkillDataset
from openclaw_ref.core.model import OpenClawConfig
from openclaw_ref.sync.errors import BadInput

DEFAULT_DATA = DataConfig()


class SkillSamples(Dataset):
    """Samples of a ``SkillDataset`` split *without* their trailing padding: (tokens_T, label, id).

    The generator pads every sample at its end only (token 0 never occurs inside a sample), so
    cutting at the recorded length loses nothing."""

    def __init__(self, ds: SkillDataset, ids: torch.Tensor) -> None:
        self.ds, self.ids = ds, ids

    def __len__(self) -> int:
        return int(self.ids.numel())

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int, int]:
        idx = int(self.ids[i])
        return self.ds.tokens[idx, : int(self.ds.lengths[idx])], int(self.ds.labels[idx]), idx

    def labels(self) -> torch.Tensor:
        return self.ds.labels[self.ids]


def pad_collate(samples: Sequence[tuple[torch.Tensor, int, int]]) -> dict[str, torch.Tensor]:
    """Dynamic padding: stack samples padded with ``PAD`` to the longest one *in this batch*.

    Invariant: the model masks ``PAD`` and positions are absolute, so logits are identical to
    those of the same samples padded to the full ``seq_len`` — only the wasted compute differs."""
    longest = max(int(t.numel()) for t, _, _ in samples)
    tokens_BT = torch.full((len(samples), longest), PAD, dtype=torch.int64)
    for row, (t, _, _) in enumerate(samples):
        tokens_BT[row, : t.numel()] = t
    return {"tokens": tokens_BT,
            "labels": torch.tensor([lab for _, lab, _ in samples], dtype=torch.int64),
            "sample_ids": torch.tensor([i for _, _, i in samples], dtype=torch.int64)}


def balancing_weights(labels: torch.Tensor, n_classes: int) -> torch.Tensor:
    """Per-sample weight 1 / (count of its label): every label is drawn equally often in
    expectation. Labels absent from the split get no weight (there is nothing to draw)."""
    counts = torch.bincount(labels, minlength=n_classes).to(torch.float64)
    return (1.0 / counts.clamp_min(1.0))[labels]


class SkillDataModule(L.LightningDataModule):
    """The synthetic skill task (``openclaw_ref.core.data``) for Lightning, padded per batch.

    ``batch_size`` is per rank (Lightning's convention). ``balance=True`` draws training samples
    through a seeded ``WeightedRandomSampler`` (with replacement) that evens out the skill
    labels; Lightning shards it across ranks with its distributed sampler wrapper."""

    def __init__(self, model_cfg: OpenClawConfig, data_cfg: DataConfig = DEFAULT_DATA,
                 batch_size: int = 16, balance: bool = False, seed: int = 1) -> None:
        super().__init__()
        if batch_size < 1:
            raise BadInput(f"batch size must be >= 1; got {batch_size}")
        self.model_cfg, self.data_cfg = model_cfg, dataclasses.replace(data_cfg, seed=seed)
        self.batch_size, self.balance, self.seed = batch_size, balance, seed
        self.ds: SkillDataset | None = None

    def setup(self, stage: str | None = None) -> None:
        if self.ds is None:
            self.ds = SkillDataset(self.model_cfg, self.data_cfg)

    def train_samples(self) -> SkillSamples:
        self.setup()
        assert self.ds is not None
        return SkillSamples(self.ds, torch.arange(self.data_cfg.n_train))

    def val_samples(self) -> SkillSamples:
        self.setup()
        assert self.ds is not None
        n = self.data_cfg.n_train
        return SkillSamples(self.ds, torch.arange(n, n + self.data_cfg.n_val))

    def sampler(self, samples: SkillSamples) -> WeightedRandomSampler | None:
        if not self.balance:
            return None
        weights = balancing_weights(samples.labels(), self.model_cfg.n_skills)
        return WeightedRandomSampler(weights, num_samples=len(samples), replacement=True,
                                     generator=torch.Generator().manual_seed(self.seed))

    def train_dataloader(self) -> DataLoader:
        samples = self.train_samples()
        sampler = self.sampler(samples)
        return DataLoader(samples, batch_size=self.batch_size, sampler=sampler,
                          shuffle=sampler is None, drop_last=True, collate_fn=pad_collate,
                          generator=torch.Generator().manual_seed(self.seed))

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val_samples(), batch_size=self.batch_size, shuffle=False,
                          collate_fn=pad_collate)


