"""The openclaw model under PyTorch Lightning (seed 004), synchronized by our own strategies.

Rooms (optional extra ``lightning``):
  ``data``      the synthetic skill task as a ``LightningDataModule`` with dynamic padding and
                optional label balancing;
  ``module``    ``OpenClawModule``, the LightningModule around ``build_model``;
  ``strategy``  ``SyncDDPStrategy``, Lightning DDP whose wrapper and comm hook come from our
                strategy registry, and which drives the training loop's callbacks (faults,
                P2 barrier, exporter: ``core/callbacks.py``) at Lightning's matching points;
  ``runner``    ``python -m openclaw_ref.integrations.lightning``: a small runner that writes a
                JSON result (tests launch it as a subprocess because Lightning's launcher
                re-executes the script for every rank).

This file names the package's user-facing API (the import line of docs/cli.md, "Lightning").
"""

from __future__ import annotations

try:
    import lightning  # noqa: F401
except ImportError as exc:  # pragma: no cover - only without the extra
    raise ImportError("openclaw_ref.integrations.lightning needs the lightning extra: "
                      "pip install 'openclaw-sync[lightning]'") from exc

from openclaw_ref.integrations.lightning.data import (
    SkillDataModule,
    SkillSamples,
    balancing_weights,
    pad_collate,
)
from openclaw_ref.integrations.lightning.module import OpenClawModule
from openclaw_ref.integrations.lightning.runner import LightningRunConfig, run_lightning
from openclaw_ref.integrations.lightning.strategy import SyncDDPStrategy

__all__ = ["LightningRunConfig", "OpenClawModule", "SkillDataModule", "SkillSamples",
           "SyncDDPStrategy", "balancing_weights", "pad_collate", "run_lightning"]
