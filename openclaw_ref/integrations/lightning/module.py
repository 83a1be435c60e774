"""``OpenClawModule``: the openclaw model as a LightningModule.

The logical step passed to the model is Lightning's ``global_step``, so sparsity follows the same
seeded schedule as ``openclaw-bench train``. Faults and metrics are not the module's business:
``SyncDDPStrategy`` drives the loop callbacks.
"""

from __future__ import annotations

import lightning as L
import torch
import torch.nn.functional as F

from openclaw_ref.core.model import EVAL_STEP, OpenClawConfig, build_model


class OpenClawModule(L.LightningModule):
    """The openclaw model as a LightningModule: cross-entropy on skill labels, AdamW."""

    def __init__(self, model_cfg: OpenClawConfig, lr: float = 3e-3) -> None:
        super().__init__()
        self.model_cfg, self.lr = model_cfg, lr
        self.model = build_model(model_cfg)

    def forward(self, tokens: torch.Tensor, sample_ids: torch.Tensor, step: int) -> torch.Tensor:
        return self.model(tokens, sample_ids, step)

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        logits = self.model(batch["tokens"], batch["sample_ids"], self.global_step)
        loss = F.cross_entropy(logits.float(), batch["labels"])
        if self._trainer is not None:  # also usable as a plain module (tests, notebooks)
            self.log("train_loss", loss.detach(), prog_bar=False)
        return loss

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        logits = self.model(batch["tokens"], batch["sample_ids"], EVAL_STEP)
        loss = F.cross_entropy(logits.float(), batch["labels"])
        self.log("val_loss", loss, sync_dist=True)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=self.lr, weight_decay=0.0)
