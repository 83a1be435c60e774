"""The sections every run configuration shares: what model is trained (``ModelSection``) and how
(``TrainSection``), with named presets of the latter.

Why sections: the training loop's ``TrainConfig``, the conformance settings and the Lightning
runner all train the same model the same way; each embeds these sections instead of repeating
preset, seed, steps, batch and learning rate, and ``TrainConfig.from_sections`` is the one
translation into a loop configuration.
"""

from __future__ import annotations

from dataclasses import dataclass

from openclaw_ref.core.model import OpenClawConfig, preset


@dataclass(frozen=True)
class ModelSection:
    """Which model: an ``openclaw_ref.core.model`` preset, its seed and sparsity range."""

    preset: str = "tiny"
    seed: int = 1
    sparsity_range: tuple[float, float] | None = None  # None: the preset's (the seed's range)

    def model_config(self) -> OpenClawConfig:
        """The preset with this seed (and sparsity range); ``ValueError`` on a bad one."""
        overrides: dict = {"seed": self.seed}
        if self.sparsity_range is not None:
            overrides["sparsity_range"] = tuple(self.sparsity_range)
        return preset(self.preset, **overrides)


@dataclass(frozen=True)
class TrainSection:
    """How it is trained: steps, the global batch (all ranks together), the optimizer."""

    steps: int = 50
    global_batch: int = 32
    lr: float = 3e-3
    optimizer: str = "adamw"
    eval_every: int = 10  # 0 = only at the end
    amp: str | None = None  # autocast dtype of forward + loss: None (fp32), "bf16" or "fp16"


# Named presets of the training section.
TRAIN_PRESETS: dict[str, TrainSection] = {
    "run": TrainSection(),  # ``openclaw-bench train``'s defaults
    # small enough to run many times on two CPU cores; the batch divides by the world size
    "conformance": TrainSection(steps=6, global_batch=8, eval_every=0),
    "lightning": TrainSection(steps=8, global_batch=16, eval_every=0),  # 8 per rank on 2 ranks
}
