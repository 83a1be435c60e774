"""The real-world corpus: published DDP silent-error patterns, each as a fault on the openclaw
model (``CorpusFault``, a loop callback) and each citing its public source (``CORPUS``).

A pattern reproduces what a user's script does wrong, at the loop's hook points; it never calls
a check and never tells one where to look. ``conformance/silent_errors_script.py`` has the
same patterns as a plain-model user script. Invariant: a pattern acts either on every rank (a
mistake every rank makes alike: ``Reach.EVERY_RANK``) or on one rank (``acting_rank``), from
``CORPUS_STEP`` on (construction-time patterns: from step 0), so ``conformance.corpus`` can
judge what a check reports against where the fault was.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from openclaw_ref.arms.config import ArmConfig
from openclaw_ref.arms.strategy import SyncStrategy
from openclaw_ref.core.callbacks import Callback
from openclaw_ref.core.faults import swap_submodules
from openclaw_ref.sync.base import RankInfo
from openclaw_ref.sync.errors import BadInput

CORPUS_STEP = 2  # the first step a per-step pattern acts on
CORPUS_RANK = 1  # the rank most one-rank patterns act on (see ``acting_rank``)
CLIP_FRACTION = 0.5  # the clipping rank's max_norm as a fraction of its gradient norm
LR_RATIO = 0.9  # the off-by-one rank's learning rate ÷ the others' (one warm-up step behind)
SCALER_RATIO = 2.0  # the rank's GradScaler scale ÷ the others'
CHECKPOINT_DELTA = 1e-2  # the checkpoint's weights − the initial ones, per element (seeded)
REPLACED_PARAM = "layer.3.ffn.w1.weight"  # the parameter re-assigned after wrapping
SWAPPED = ("layer.3.attn.q_proj", "layer.3.attn.v_proj")  # same-shaped, registered apart


class Reach(enum.StrEnum):
    ONE_RANK = "one rank"
    EVERY_RANK = "every rank"


@dataclass(frozen=True)
class Pattern:
    """One published pattern: its name (the CLI's and the table's), the public source (short
    name and URL), where it acts, and whether it is in effect from construction."""

    name: str
    source: str
    url: str
    reach: Reach
    at_construction: bool = False

    @property
    def first_step(self) -> int:
        return 0 if self.at_construction else CORPUS_STEP


CORPUS: tuple[Pattern, ...] = (
    Pattern("convert-after-wrap", "pytorch#104336",
            "https://github.com/pytorch/pytorch/issues/104336", Reach.EVERY_RANK, True),
    Pattern("forward-via-module", "OpenTSLM#49",
            "https://github.com/OpenTSLM/OpenTSLM/pull/49", Reach.EVERY_RANK, True),
    Pattern("param-replaced-after-wrap", "pytorch#12603",
            "https://github.com/pytorch/pytorch/issues/12603", Reach.EVERY_RANK, True),
    Pattern("clip-one-rank", "Megatron-DeepSpeed#274 (BLOOM-176B)",
            "https://github.com/bigscience-workshop/Megatron-DeepSpeed/pull/274",
            Reach.ONE_RANK),
    Pattern("lr-off-by-one", "Lightning#4655",
            "https://github.com/Lightning-AI/pytorch-lightning/issues/4655", Reach.ONE_RANK),
    Pattern("skip-step-one-rank", "NeMo-Automodel#2468",
            "https://github.com/NVIDIA-NeMo/Automodel/pull/2468", Reach.ONE_RANK),
    Pattern("layer-order", "transformers#48162",
            "https://github.com/huggingface/transformers/pull/48162", Reach.ONE_RANK, True),
    Pattern("load-on-rank0-after-wrap", "detr#235",
            "https://github.com/facebookresearch/detr/issues/235", Reach.ONE_RANK, True),
    Pattern("scaler-state-differs", "pytorch#136009",
            "https://github.com/pytorch/pytorch/issues/136009", Reach.ONE_RANK),
    Pattern("data-not-sharded", "Lightning#7813",
            "https://github.com/Lightning-AI/pytorch-lightning/issues/7813", Reach.EVERY_RANK),
)
PATTERNS: dict[str, Pattern] = {p.name: p for p in CORPUS}


def pattern(name: str) -> Pattern:
    if name not in PATTERNS:
        raise BadInput(f"unknown corpus pattern {name!r}; choose one of {', '.join(PATTERNS)}")
    return PATTERNS[name]


def acting_rank(p: Pattern, world_size: int) -> int:
    """The rank a one-rank pattern acts on; an every-rank pattern: rank 0 (each rank makes the
    mistake, and a check run on every rank names at least the rank it runs on)."""
    if p.reach is Reach.EVERY_RANK or p.name == "load-on-rank0-after-wrap":
        return 0
    return min(CORPUS_RANK, world_size - 1)


def checkpoint_of(model: nn.Module, seed: int = 7) -> dict[str, torch.Tensor]:
    """A "checkpoint": the model's state moved by a seeded ±``CHECKPOINT_DELTA`` per element."""
    g = torch.Generator().manual_seed(seed)
    return {k: v + CHECKPOINT_DELTA * torch.randn(v.shape, generator=g).to(v)
            for k, v in model.state_dict().items()}


def replace_parameter(model: nn.Module, name: str) -> None:
    """Re-assign parameter ``name`` with a new ``nn.Parameter`` of the same value."""
    parent_name, _, leaf = name.rpartition(".")
    parent = model.get_submodule(parent_name)
    setattr(parent, leaf, nn.Parameter(getattr(parent, leaf).detach().clone()))


class CorpusFault(Callback):
    """Applies one corpus pattern as the user's script would make the mistake. ``replaced``
    and ``swapped`` name what the two model-specific patterns act on (default: the openclaw
    model's; ``conformance.user_faults`` aims them at a user's model)."""

    def __init__(self, name: str, rank: int, world_size: int, *,
                 replaced: str = REPLACED_PARAM,
                 swapped: tuple[str, str] = SWAPPED) -> None:
        self.pattern = pattern(name)
        self.replaced, self.swapped = replaced, swapped
        self.rank = rank
        self.world_size = world_size
        self.mine = (self.pattern.reach is Reach.EVERY_RANK
                     or rank == acting_rank(self.pattern, world_size))
        self._handles: list = []
        self._before: list[torch.Tensor] | None = None
        self._local: dict[int, torch.Tensor] = {}

    def _on(self, name: str, step: int | None = None) -> bool:
        return (self.mine and self.pattern.name == name
                and (step is None or step >= self.pattern.first_step))

    def setup(self, model: nn.Module, sync: ArmConfig) -> ArmConfig:
        if self._on("layer-order"):
            swap_submodules(model, *self.swapped)
        return sync

    def wrap(self, model: nn.Module, ctx: RankInfo, strategy: SyncStrategy) -> nn.Module | None:
        if not self.pattern.at_construction or self.pattern.name == "layer-order":
            return None
        module = strategy.wrap(model, ctx)
        if self._on("convert-after-wrap"):
            module.double()
            module.float()
        elif self._on("param-replaced-after-wrap"):
            replace_parameter(model, self.replaced)
        elif self._on("load-on-rank0-after-wrap"):
            model.load_state_dict(checkpoint_of(model))
        elif self._on("forward-via-module"):
            return getattr(module, "module", module)
        return module

    def before_backward(self, step: int, model: nn.Module) -> None:
        if self._on("scaler-state-differs", step):
            self._hook_all(model, lambda g: g * SCALER_RATIO)
        if self._on("data-not-sharded", step):
            for p in model.parameters():
                if p.requires_grad:
                    self._handles.append(p.register_hook(self._keeper(p)))

    def _hook_all(self, model: nn.Module, fn) -> None:
        for p in model.parameters():
            if p.requires_grad:
                self._handles.append(p.register_hook(fn))

    def _keeper(self, p: nn.Parameter):
        def keep(grad: torch.Tensor) -> None:
            self._local[id(p)] = grad.detach().clone()
        return keep

    def after_sync(self, step: int, model: nn.Module, strategy: SyncStrategy,
                   applied: bool) -> None:
        params = [p for p in model.parameters() if p.grad is not None]
        with torch.no_grad():
            if self._on("clip-one-rank", step):
                norm = torch.nn.utils.get_total_norm([p.grad for p in params])
                torch.nn.utils.clip_grad_norm_(params, max_norm=CLIP_FRACTION * float(norm))
            if self._on("scaler-state-differs", step):
                for p in params:
                    p.grad.div_(SCALER_RATIO)  # each rank unscales by its own scale
            if self._on("data-not-sharded", step):
                self._same_data(params)
        if self._on("lr-off-by-one", step) or self._on("skip-step-one-rank", step):
            self._before = [p.detach().clone() for p in model.parameters()]

    def _same_data(self, params: list[nn.Parameter]) -> None:
        """Every rank read rank 0's batch: the average is rank 0's local gradient."""
        local = [self._local.get(id(p), torch.zeros_like(p.grad)) for p in params]
        flat = torch.cat([g.reshape(-1) for g in local])
        dist.broadcast(flat, src=0)
        offset = 0
        for p in params:
            n = p.grad.numel()
            p.grad.copy_(flat[offset:offset + n].view_as(p.grad))
            offset += n
        self._local.clear()

    def after_step(self, step: int, model: nn.Module) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()
        if self._before is None:
            return
        ratio = LR_RATIO if self.pattern.name == "lr-off-by-one" else 0.0
        skip_now = self.pattern.name == "skip-step-one-rank" and step == CORPUS_STEP
        if self.pattern.name == "lr-off-by-one" or skip_now:
            with torch.no_grad():
                for p, before in zip(model.parameters(), self._before, strict=True):
                    p.copy_(before + (p - before) * ratio)
        self._before = None
